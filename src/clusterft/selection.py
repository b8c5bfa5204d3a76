"""Balanced, weighted selection under an exact data budget.

`cluster`: the budget is split across clusters by water-filling (equal quota, capped at
cluster size, leftover redistributed), so small clusters are kept whole and big redundant
ones are cut hardest. Each kept sample gets weight (n_k / m_k)^alpha, normalised to mean 1,
so the weighted loss is an unbiased estimate of the full-data loss when alpha = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class SelectionError(ValueError):
    """Budget or inputs are unusable; the message names the parameter."""


@dataclass
class Selection:
    rows: np.ndarray  # [M] int64 indices into the training set, ascending
    clusters: np.ndarray  # [M] int64 cluster of each kept sample (-1: no clustering)
    weights: np.ndarray  # [M] float64 per-sample loss weight, mean 1

    def records(self, ids: list[str]) -> list[dict]:
        return [
            {"id": ids[r], "row": int(r), "cluster": int(c), "weight": round(float(w), 8)}
            for r, c, w in zip(self.rows, self.clusters, self.weights)
        ]


def budget_count(budget: float, n: int) -> int:
    """A fraction in (0, 1] of n, or an absolute count (> 1); always in [1, n]."""
    if budget <= 0:
        raise SelectionError(f"select.budget must be > 0, got {budget}")
    m = int(round(budget * n)) if budget <= 1 else int(budget)
    if m > n:
        raise SelectionError(f"select.budget={budget} asks for {m} samples but train has {n}")
    return max(1, m)


def waterfill(sizes: np.ndarray, total: int) -> np.ndarray:
    """Split `total` over clusters: equal shares, capped at size, leftover redistributed.

    Exact: the result sums to `total` (which must not exceed sizes.sum()). Remainders go to
    the clusters with the most spare capacity, ties to the lower index (deterministic).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if total > sizes.sum():
        raise SelectionError(f"budget {total} exceeds the {int(sizes.sum())} samples available")
    quota = np.zeros_like(sizes)
    left = total
    while left > 0:
        open_ = np.flatnonzero(quota < sizes)
        share = left // len(open_)
        if share == 0:
            spare = sizes[open_] - quota[open_]
            order = open_[np.lexsort((open_, -spare))][:left]
            quota[order] += 1
            break
        add = np.minimum(share, sizes[open_] - quota[open_])
        quota[open_] += add
        left -= int(add.sum())
    return quota


def unbiased_weights(sizes: np.ndarray, quotas: np.ndarray, clusters: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """w_i = (n_k / m_k)^alpha for each kept sample's cluster k, normalised to mean 1."""
    ratio = np.where(quotas > 0, sizes / np.maximum(quotas, 1), 0.0) ** alpha
    w = ratio[clusters]
    return w / w.mean()


def select_full(n: int) -> Selection:
    return Selection(np.arange(n, dtype=np.int64), np.full(n, -1, np.int64), np.ones(n))


def select_random(n: int, budget: float, seed: int) -> Selection:
    m = budget_count(budget, n)
    rows = np.sort(np.random.default_rng(seed).choice(n, size=m, replace=False)).astype(np.int64)
    return Selection(rows, np.full(m, -1, np.int64), np.ones(m))


def select_cluster(
    labels: np.ndarray,
    features: np.ndarray,
    centers: np.ndarray,
    budget: float,
    seed: int,
    within: str = "far",
    alpha: float = 1.0,
) -> Selection:
    """Water-filled quotas per cluster; inside a cluster keep far/near/random samples."""
    from clusterft.clustering import l2_normalize

    n = len(labels)
    k = len(centers)
    sizes = np.bincount(labels, minlength=k)
    quotas = waterfill(sizes, budget_count(budget, n))
    rng = np.random.default_rng(seed)
    x = l2_normalize(np.asarray(features, dtype=np.float32))
    kept: list[np.ndarray] = []
    for c in range(k):
        members = np.flatnonzero(labels == c)
        if quotas[c] == 0:
            continue
        if within == "random":
            pick = rng.choice(members, size=quotas[c], replace=False)
        elif within in ("far", "near"):
            dist = np.linalg.norm(x[members] - centers[c], axis=1)
            order = np.lexsort((members, -dist if within == "far" else dist))
            pick = members[order[: quotas[c]]]
        else:
            raise SelectionError(f"select.within must be far, near or random, got {within!r}")
        kept.append(pick)
    rows = np.sort(np.concatenate(kept)).astype(np.int64)
    clusters = labels[rows].astype(np.int64)
    return Selection(rows, clusters, unbiased_weights(sizes, quotas, clusters, alpha))


def write_selection(path, selection: Selection, ids: list[str]) -> None:
    """selection.jsonl: one line per kept sample {id, row, cluster, weight}, by row."""
    from clusterft.data import write_jsonl

    write_jsonl(path, selection.records(ids))


def read_selection(path) -> dict[str, list]:
    """Columns of a selection.jsonl: id, row, cluster, weight."""
    import json
    from pathlib import Path

    cols: dict[str, list] = {"id": [], "row": [], "cluster": [], "weight": []}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        for k in cols:
            cols[k].append(rec[k])
    return cols


def run_select(cfg, method: str) -> dict:
    """Stage `select`: writes methods/<method>/selection.jsonl and select_metrics.json."""
    import time

    from clusterft.artifacts import load_npy, write_json
    from clusterft.data import load_examples

    start = time.perf_counter()
    ids = [e.id for e in load_examples(cfg, "train")]
    n = len(ids)
    s = cfg.select
    if method == "full":
        sel = select_full(n)
    elif method == "random":
        sel = select_random(n, s.budget, s.seed)
    elif method == "cluster":
        labels = load_npy(cfg.artifact("cluster", "labels.npy"))
        if len(labels) != n:
            raise SelectionError(
                f"{cfg.artifact('cluster', 'labels.npy')}: {len(labels)} labels for {n} train samples; "
                "rerun features and cluster on the current data"
            )
        sel = select_cluster(
            labels, load_npy(cfg.artifact("features", "features.npy"), mmap=True),
            load_npy(cfg.artifact("cluster", "centers.npy")), s.budget, s.seed, s.within, s.alpha,
        )
    else:
        raise SelectionError(f"unknown select method {method!r}")
    out = cfg.artifact("methods", method)
    write_selection(out / "selection.jsonl", sel, ids)
    metrics = {
        "method": method,
        "n_train": n,
        "n_selected": int(len(sel.rows)),
        "kept_fraction": len(sel.rows) / n,
        "weight_min": float(sel.weights.min()),
        "weight_max": float(sel.weights.max()),
        "wall_clock_s": time.perf_counter() - start,
    }
    write_json(out / "select_metrics.json", metrics)
    return metrics
