"""Stage `cluster`: k-means on the normalised features (K independent of the workers, or
chosen by silhouette); the clusters record the digest of the features they came from, so
`select` refuses clusters of stale features."""

from __future__ import annotations

import time
from typing import Any

from clusterft.core.clustering import choose_k, cluster_features
from clusterft.io.artifacts import file_digest, load_npy, save_npy, write_json


def run_cluster(cfg: Any) -> dict:
    """Stage `cluster`: cluster/labels.npy, centers.npy and metrics.json (sizes, time)."""
    start = time.perf_counter()
    cc = cfg.cluster
    feats = load_npy(cfg.artifact("features", "features.npy"), mmap=True)
    made_from = file_digest(cfg.artifact("features", "features.npy"))  # select refuses stale clusters
    auto_scores: dict = {}
    k = cc.k
    if k == "auto":
        k, auto_scores = choose_k(feats, cc.k_min, cc.k_max, cc.auto_sample, cc.seed)
    c, backend = cluster_features(feats, int(k), cc.n_init, cc.seed, cc.backend)
    out = cfg.artifact("cluster")
    save_npy(out / "labels.npy", c.labels)
    save_npy(out / "centers.npy", c.centers)
    sizes = c.sizes
    metrics = {
        "k": int(len(sizes)), "n": int(len(c.labels)), "inertia": c.inertia, "backend": backend,
        "auto_k_silhouette": {str(key): v for key, v in auto_scores.items()},
        "sizes": sizes.tolist(), "largest": int(sizes.max()), "smallest": int(sizes.min()),
        "features_digest": made_from, "wall_clock_s": time.perf_counter() - start,
    }
    write_json(out / "metrics.json", metrics)
    return metrics
