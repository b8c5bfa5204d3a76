"""k-means in gradient space: L2-normalised features, K chosen freely (not tied to workers)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clusterft.errors import ClusteringError
from clusterft.spec.config import EXACT_KMEANS_ROWS


@dataclass
class Clustering:
    labels: np.ndarray  # [N] int64 cluster of each sample
    centers: np.ndarray  # [K, D] float32, unit-norm rows' mean (not re-normalised)
    inertia: float

    @property
    def sizes(self) -> np.ndarray:
        return np.bincount(self.labels, minlength=len(self.centers))


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Row-wise unit norm (zero rows stay zero)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32)


def check_features(x: np.ndarray, name: str = "features", chunk: int = 65536) -> None:
    """Non-empty [N, D] with only finite values (checked in chunks: x may be a memmap)."""
    if x.ndim != 2 or x.shape[0] == 0:
        raise ClusteringError(f"{name}: expected a non-empty [N, D] array, got shape {x.shape}")
    bad_rows: list[int] = []
    n_bad = 0
    for i in range(0, x.shape[0], chunk):
        bad = np.flatnonzero(~np.isfinite(x[i : i + chunk]).all(axis=1)) + i
        n_bad += len(bad)
        bad_rows += bad[: 5 - len(bad_rows)].tolist()
    if n_bad:
        raise ClusteringError(f"{name}: {n_bad} rows contain NaN/inf (first rows {bad_rows})")


def _check_k(k: int, n: int) -> None:
    if k < 1:
        raise ClusteringError(f"cluster.k must be >= 1, got {k}")
    if k > n:
        raise ClusteringError(f"cluster.k={k} is larger than the number of samples N={n}")


def kmeans(features: np.ndarray, k: int, n_init: int = 4, seed: int = 0) -> Clustering:
    """Exact k-means (scikit-learn) on L2-normalised rows, all in memory."""
    from sklearn.cluster import KMeans

    check_features(features)
    _check_k(k, features.shape[0])
    x = l2_normalize(np.asarray(features))
    km = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit(x)
    return Clustering(
        labels=km.labels_.astype(np.int64),
        centers=km.cluster_centers_.astype(np.float32),
        inertia=float(km.inertia_),
    )


def assign_chunked(features: np.ndarray, centers: np.ndarray, chunk: int = 65536) -> tuple[np.ndarray, float]:
    """Nearest centre of every (normalised) row, reading `features` in chunks; (labels, inertia)."""
    import faiss

    index = faiss.IndexFlatL2(centers.shape[1])
    index.add(np.ascontiguousarray(centers, dtype=np.float32))
    labels = np.empty(features.shape[0], dtype=np.int64)
    inertia = 0.0
    for i in range(0, features.shape[0], chunk):
        d, idx = index.search(l2_normalize(np.asarray(features[i : i + chunk])), 1)
        labels[i : i + chunk] = idx[:, 0]
        inertia += float(d.sum())
    return labels, inertia


def kmeans_large(features: np.ndarray, k: int, n_init: int = 1, seed: int = 0,
                 sample_per_centroid: int = 256) -> Clustering:
    """faiss k-means trained on a seeded sample (k * sample_per_centroid rows), then every row
    assigned in chunks, so a memory-mapped [N, D] file never has to be loaded whole."""
    import faiss

    check_features(features)
    n, d = features.shape
    _check_k(k, n)
    rng = np.random.default_rng(seed)
    m = min(n, k * sample_per_centroid)
    rows = np.sort(rng.choice(n, size=m, replace=False)) if m < n else np.arange(n)
    sample = l2_normalize(np.asarray(features[rows]))
    km = faiss.Kmeans(d, k, niter=20, nredo=max(1, n_init), seed=int(seed) + 1,
                      max_points_per_centroid=sample_per_centroid, verbose=False)
    km.train(sample)
    labels, inertia = assign_chunked(features, km.centroids)
    return Clustering(labels=labels, centers=km.centroids.astype(np.float32), inertia=inertia)


AUTO_K_GRID = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def choose_k(features: np.ndarray, k_min: int, k_max: int, sample: int, seed: int) -> tuple[int, dict]:
    """K with the best silhouette (cosine geometry) on a seeded sample of rows.

    Silhouette rewards compact, well separated clusters and needs no reference
    distribution (the gap statistic does, at many extra k-means runs), so its cost is
    bounded by the sample size whatever N is."""
    from sklearn.metrics import silhouette_score

    n = features.shape[0]
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(n, size=min(n, sample), replace=False))
    x = l2_normalize(np.asarray(features[rows]))
    scores = {}
    for k in (k for k in AUTO_K_GRID if k_min <= k <= min(k_max, len(x) - 1)):
        labels = kmeans(x, k, n_init=2, seed=seed).labels
        scores[k] = float(silhouette_score(x, labels))
    if not scores:
        raise ClusteringError(f"cluster.k=auto: no K in [{k_min}, {k_max}] fits {len(x)} samples")
    return max(scores, key=scores.get), scores


def cluster_features(features: np.ndarray, k: int, n_init: int, seed: int, backend: str = "auto",
                     large_threshold: int = EXACT_KMEANS_ROWS) -> tuple[Clustering, str]:
    """Dispatch by backend; `auto` = exact scikit-learn up to `large_threshold` rows, faiss above."""
    if backend == "auto":
        backend = "sklearn" if features.shape[0] <= large_threshold else "faiss"
    if backend == "sklearn":
        return kmeans(features, k, n_init, seed), backend
    if backend == "faiss":
        return kmeans_large(features, k, n_init, seed), backend
    raise ClusteringError(f"cluster.backend must be auto, sklearn or faiss, got {backend!r}")
