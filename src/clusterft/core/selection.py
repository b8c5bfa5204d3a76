"""Balanced, weighted selection under an exact data budget.

`cluster`: the budget is split across clusters by water-filling (equal quota, capped at
cluster size, leftover redistributed), so small clusters are kept whole and big redundant
ones are cut hardest. Each kept sample gets weight (n_k / m_k)^alpha, normalised to mean 1,
so the weighted loss is an unbiased estimate of the full-data loss when alpha = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clusterft.core.clustering import kmeans, l2_normalize
from clusterft.errors import SelectionError


@dataclass
class Selection:
    rows: np.ndarray  # [M] int64 indices into the training set, ascending
    clusters: np.ndarray  # [M] int64 cluster of each kept sample (-1: no clustering)
    weights: np.ndarray  # [M] float64 per-sample loss weight, mean 1


def budget_count(budget: float, n: int) -> int:
    """A fraction in (0, 1] of n, or an absolute count (> 1); always in [1, n]."""
    if budget <= 0:
        raise SelectionError(f"select.budget must be > 0, got {budget}")
    m = int(round(budget * n)) if budget <= 1 else int(budget)
    if m > n:
        raise SelectionError(f"select.budget={budget} asks for {m} samples but train has {n}")
    return max(1, m)


def split_budget(sizes: np.ndarray, total: int, tau: float = 0.0) -> np.ndarray:
    """Integer quota per cluster proportional to n_k^tau, capped at n_k, summing to `total`.

    tau = 0 is water-filling (equal shares, capped, leftover redistributed); tau = 1 is
    proportional to cluster size. Capped clusters are fixed and the rest is re-split until
    no share exceeds its cluster; fractions are rounded by largest remainder (ties: lower
    index), so the result is exact and deterministic.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if total > sizes.sum():
        raise SelectionError(f"budget {total} exceeds the {int(sizes.sum())} samples available")
    quota = np.zeros_like(sizes)
    free = sizes > 0
    left = int(total)
    while left > 0:
        idx = np.flatnonzero(free)
        mass = sizes[idx].astype(np.float64) ** tau
        share = left * mass / mass.sum()
        over = share >= sizes[idx]
        if over.any():
            quota[idx[over]] = sizes[idx[over]]
            free[idx[over]] = False
            left -= int(sizes[idx[over]].sum())
            continue
        base = np.floor(share).astype(np.int64)
        rest = left - int(base.sum())
        order = np.lexsort((idx, -(share - base)))[:rest]
        base[order] += 1
        quota[idx] = base
        left = 0
    return quota


def waterfill(sizes: np.ndarray, total: int) -> np.ndarray:
    """Equal quota per cluster, capped at its size, leftover redistributed (exact)."""
    return split_budget(sizes, total, tau=0.0)


SPLIT_TAU = {"waterfill": 0.0, "proportional": 1.0}
FILLS = ("copies", "distinct")


def kcenter_greedy(x: np.ndarray, m: int, start: int) -> np.ndarray:
    """m distinct row indices of x covering it best: each pick is the unchosen row farthest
    from those chosen. Exact duplicates (distance 0) come last, but are still distinct rows."""
    if not 0 < m <= len(x):
        raise SelectionError(f"k-center needs 0 < m <= {len(x)} rows, got m={m}")
    chosen = [start]
    dist = np.linalg.norm(x - x[start], axis=1)
    dist[start] = -np.inf
    for _ in range(m - 1):
        nxt = int(np.argmax(dist))
        chosen.append(nxt)
        dist = np.minimum(dist, np.linalg.norm(x - x[nxt], axis=1))
        dist[nxt] = -np.inf  # chosen rows stay at -inf: the minimum keeps them there
    return np.asarray(chosen, dtype=np.int64)


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


def duplicate_groups(texts: list[str]) -> np.ndarray:
    """[N] group id per text: equal ids for texts equal up to case and whitespace."""
    seen: dict[str, int] = {}
    return np.array([seen.setdefault(" ".join(t.lower().split()), len(seen)) for t in texts],
                    dtype=np.int64)


def _distinct_first(members: np.ndarray, groups: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Split a cluster's rows into one representative per duplicate group and the copies."""
    if groups is None:
        return members, members[:0]
    _, first = np.unique(groups[members], return_index=True)
    is_first = np.zeros(len(members), dtype=bool)
    is_first[first] = True
    return members[is_first], members[~is_first]


def _pick(members: np.ndarray, q: int, x: np.ndarray, center: np.ndarray, within: str,
          rng: np.random.Generator) -> np.ndarray:
    """q rows of `members` by the within-cluster rule."""
    if q == 0:
        return members[:0]
    if within == "random":
        return rng.choice(members, size=q, replace=False)
    if within in ("far", "near"):
        dist = np.linalg.norm(x[members] - center, axis=1)
        return members[np.lexsort((members, -dist if within == "far" else dist))[:q]]
    if within == "kcenter":  # start from the point farthest from the centre
        xm = x[members]
        start = int(np.argmax(np.linalg.norm(xm - center, axis=1)))
        return members[kcenter_greedy(xm, q, start)]
    raise SelectionError(f"select.within must be far, near, random or kcenter, got {within!r}")


def cluster_quotas(labels: np.ndarray, k: int, budget: float, split: str, tau: float,
                   groups: np.ndarray | None, fill: str = "copies"
                   ) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """(per cluster: its distinct samples and its copies; cluster sizes; quotas): the budget
    split over clusters by `split`, spent on distinct samples first (see select_cluster).
    A budget above the distinct content is filled with copies (`fill` copies, split over
    the clusters' copies by `split`) or stops there (`fill` distinct: fewer samples)."""
    sizes = np.bincount(labels, minlength=k)
    if split not in (*SPLIT_TAU, "power"):
        raise SelectionError(f"select.split must be waterfill, proportional or power, got {split!r}")
    tau_eff, m = SPLIT_TAU.get(split, tau), budget_count(budget, len(labels))
    parts = [_distinct_first(np.flatnonzero(labels == c), groups) for c in range(k)]
    distinct = np.array([len(p[0]) for p in parts], dtype=np.int64)
    if fill not in FILLS:
        raise SelectionError(f"select.fill must be one of {FILLS}, got {fill!r}")
    if m <= distinct.sum():
        quotas = split_budget(distinct, m, tau_eff)
    elif fill == "distinct":
        quotas = distinct
    else:
        quotas = distinct + split_budget(sizes - distinct, m - int(distinct.sum()), tau_eff)
    return parts, sizes, quotas


def select_cluster_dynamic(labels: np.ndarray, k: int, budget: float, split: str, tau: float, alpha: float,
                           groups: np.ndarray | None = None, fill: str = "copies") -> tuple[Selection, dict[int, int]]:
    """cluster_dynamic's pool and per-epoch quotas: every distinct sample of each cluster with
    a quota (copies too where the quota needs them), each weighted (n_k / q_k)^alpha,
    normalised to mean 1 over an epoch's draw, so each epoch's weighted loss keeps every
    cluster's mass as `cluster` does."""
    parts, sizes, quotas = cluster_quotas(labels, k, budget, split, tau, groups, fill)
    pool = [first if quotas[c] <= len(first) else np.concatenate([first, copies])
            for c, (first, copies) in enumerate(parts) if quotas[c] > 0]
    rows = np.sort(np.concatenate(pool)).astype(np.int64)
    clusters = labels[rows].astype(np.int64)
    ratio = np.where(quotas > 0, sizes / np.maximum(quotas, 1), 0.0) ** alpha
    weights = ratio[clusters] / ((quotas * ratio).sum() / quotas.sum())
    return Selection(rows, clusters, weights), {int(c): int(q) for c, q in enumerate(quotas) if q > 0}


def select_cluster(
    labels: np.ndarray,
    features: np.ndarray,
    centers: np.ndarray,
    budget: float,
    seed: int,
    within: str = "far",
    alpha: float = 1.0,
    split: str = "waterfill",
    tau: float = 0.5,
    groups: np.ndarray | None = None,
    fill: str = "copies",
) -> Selection:
    """Quotas per cluster by `split` (waterfill, proportional, power with n_k^tau); inside a
    cluster keep the samples farthest from / nearest to the centre, random, or k-center.
    With duplicate `groups` (see duplicate_groups), a cluster spends its quota on distinct
    samples first and its quota is capped at its number of distinct samples while the
    budget allows (copies are pure redundancy), the rest going to other clusters; weights
    still use the full cluster sizes, so the copies' mass is kept. A budget above the
    distinct content is filled with copies or stops at it (`fill`, see cluster_quotas)."""
    x = l2_normalize(np.asarray(features, dtype=np.float32))
    parts, sizes, quotas = cluster_quotas(labels, len(centers), budget, split, tau, groups, fill)
    rng = np.random.default_rng(seed)
    kept: list[np.ndarray] = []
    for c, (firsts, copies) in enumerate(parts):
        q_first = int(min(quotas[c], len(firsts)))
        kept.append(_pick(firsts, q_first, x, centers[c], within, rng))
        kept.append(_pick(copies, int(quotas[c]) - q_first, x, centers[c], within, rng))
    rows = np.sort(np.concatenate(kept)).astype(np.int64)
    if np.any(rows[1:] == rows[:-1]):  # a repeated row would be trained twice, silently
        raise SelectionError(f"within={within!r} picked a sample twice")
    clusters = labels[rows].astype(np.int64)
    return Selection(rows, clusters, unbiased_weights(sizes, quotas, clusters, alpha))


def soft_cap_reassign(x: np.ndarray, labels: np.ndarray, centers: np.ndarray, cap: int,
                      n_near: int = 8) -> np.ndarray:
    """The reference code's balancing: when the largest cluster exceeds `cap`, points are
    reassigned greedily (closest points first) to the nearest of their `n_near` nearest
    centres that still has room; a point with no room anywhere keeps its nearest centre."""
    k = len(centers)
    if np.bincount(labels, minlength=k).max() <= cap:
        return labels
    dist = np.linalg.norm(x[:, None, :] - centers[None, :, :], axis=2)  # [N, K]
    near = np.argsort(dist, axis=1, kind="stable")[:, : min(n_near, k)]
    out = np.empty_like(labels)
    count = np.zeros(k, dtype=np.int64)
    for i in np.lexsort((np.arange(len(x)), dist.min(axis=1))):
        room = [c for c in near[i] if count[c] < cap]
        c = room[0] if room else near[i, 0]
        out[i] = c
        count[c] += 1
    return out


def select_cluster_paper(features: np.ndarray, world_size: int, ratio: float, seed: int) -> Selection:
    """CluSTER reference rules: K = world size, k-means (n_init=10), soft cap ceil(1.5 N/K),
    every cluster cut to floor(min size * ratio) keeping the farthest from its centre, and
    weight K * n_k / N for every sample of cluster k (the per-rank loss weight)."""
    if not 0 < ratio <= 1:
        raise SelectionError(f"select.paper_ratio must be in (0, 1], got {ratio}")
    x = l2_normalize(np.asarray(features, dtype=np.float32))
    n, k = len(x), world_size
    c = kmeans(x, k, n_init=10, seed=seed)
    labels = soft_cap_reassign(x, c.labels, c.centers, int(np.ceil(1.5 * n / k)))
    sizes = np.bincount(labels, minlength=k)
    m = int(np.floor(sizes.min() * ratio))
    if m < 1:
        raise SelectionError(
            f"cluster_paper: smallest of {k} clusters has {sizes.min()} samples; "
            f"floor({sizes.min()} * {ratio}) leaves nothing to train"
        )
    rows, weights = [], []
    for j in range(k):
        members = np.flatnonzero(labels == j)
        dist = np.linalg.norm(x[members] - c.centers[j], axis=1)
        rows.append(members[np.lexsort((members, -dist))[:m]])
    rows_a = np.sort(np.concatenate(rows)).astype(np.int64)
    clusters = labels[rows_a].astype(np.int64)
    weights = (k * sizes / n)[clusters]
    return Selection(rows_a, clusters, weights)
