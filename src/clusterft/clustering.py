"""k-means in gradient space: L2-normalised features, K chosen freely (not tied to workers)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class ClusteringError(ValueError):
    """Features or K are unusable; the message says which and why."""


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


def check_features(x: np.ndarray, name: str = "features") -> None:
    if x.ndim != 2 or x.shape[0] == 0:
        raise ClusteringError(f"{name}: expected a non-empty [N, D] array, got shape {x.shape}")
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)[:5].tolist()
        raise ClusteringError(f"{name}: {int(bad.sum())} rows contain NaN/inf (first rows {rows})")


def kmeans(features: np.ndarray, k: int, n_init: int = 4, seed: int = 0) -> Clustering:
    """k-means (scikit-learn) on L2-normalised rows."""
    from sklearn.cluster import KMeans

    check_features(features)
    n = features.shape[0]
    if k < 1:
        raise ClusteringError(f"cluster.k must be >= 1, got {k}")
    if k > n:
        raise ClusteringError(f"cluster.k={k} is larger than the number of samples N={n}")
    x = l2_normalize(features)
    km = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit(x)
    return Clustering(
        labels=km.labels_.astype(np.int64),
        centers=km.cluster_centers_.astype(np.float32),
        inertia=float(km.inertia_),
    )


def run_cluster(cfg) -> dict:
    """Stage `cluster`: cluster/labels.npy, centers.npy and metrics.json (sizes, time)."""
    import time

    from clusterft.artifacts import load_npy, save_npy, write_json

    start = time.perf_counter()
    feats = load_npy(cfg.artifact("features", "features.npy"))
    c = kmeans(feats, cfg.cluster.k, cfg.cluster.n_init, cfg.cluster.seed)
    out = cfg.artifact("cluster")
    save_npy(out / "labels.npy", c.labels)
    save_npy(out / "centers.npy", c.centers)
    sizes = c.sizes
    metrics = {
        "k": int(len(sizes)), "n": int(len(c.labels)), "inertia": c.inertia,
        "sizes": sizes.tolist(), "largest": int(sizes.max()), "smallest": int(sizes.min()),
        "wall_clock_s": time.perf_counter() - start,
    }
    write_json(out / "metrics.json", metrics)
    return metrics
