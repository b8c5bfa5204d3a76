"""Clustering at scale: N x D float32 features in a memory-mapped .npy, clustered and every
row assigned with the backend `cluster.backend: auto` picks (faiss above 50k rows).

Prints wall-clock and peak resident memory (the process's own, measured by the OS).
Usage: python benchmarks/bench_cluster.py [--n 1000000] [--dim 256] [--k 256]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from clusterft.core.clustering import cluster_features


def make_features(path: Path, n: int, dim: int, k: int, seed: int, chunk: int = 100_000) -> None:
    """Mixture of k random directions with noise, written chunk by chunk (never all in RAM)."""
    rng = np.random.default_rng(seed)
    dirs = rng.normal(size=(k, dim)).astype(np.float32)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, dim))
    for i in range(0, n, chunk):
        m = min(chunk, n - i)
        lab = rng.integers(0, k, size=m)
        out[i : i + m] = dirs[lab] + 0.5 * rng.normal(size=(m, dim)).astype(np.float32)
    out.flush()
    del out


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux: KiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "features.npy"
        t = time.perf_counter()
        make_features(path, args.n, args.dim, args.k, args.seed)
        gen_s = time.perf_counter() - t
        feats = np.load(path, mmap_mode="r")
        t = time.perf_counter()
        c, backend = cluster_features(feats, args.k, n_init=1, seed=args.seed)
        secs = time.perf_counter() - t
    sizes = c.sizes
    print(f"features: {args.n} x {args.dim} float32 ({args.n * args.dim * 4 / 1e9:.2f} GB, memory-mapped; "
          f"written in {gen_s:.1f} s)")
    print(f"backend={backend} k={args.k}: cluster + assign all rows {secs:.1f} s "
          f"(goal <= 300 s); peak RSS {peak_rss_gb():.2f} GB (goal <= 8 GB)")
    print(f"cluster sizes: min {sizes.min()} median {int(np.median(sizes))} max {sizes.max()}")


if __name__ == "__main__":
    main()
