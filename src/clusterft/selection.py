"""Balanced, weighted selection under an exact data budget.

`cluster`: the budget is split across clusters by water-filling (equal quota, capped at
cluster size, leftover redistributed), so small clusters are kept whole and big redundant
ones are cut hardest. Each kept sample gets weight (n_k / m_k)^alpha, normalised to mean 1,
so the weighted loss is an unbiased estimate of the full-data loss when alpha = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clusterft.methods import METHODS


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
    from clusterft.clustering import l2_normalize

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
    from clusterft.clustering import kmeans, l2_normalize

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


def _plot_selection(cfg, sel: Selection, plot_dir) -> None:
    """Cluster sizes before/after (against the k-means clusters when they exist) and weights."""
    from clusterft import plots
    from clusterft.artifacts import load_npy

    labels_path = cfg.artifact("cluster", "labels.npy")
    if labels_path.exists():
        labels = load_npy(labels_path)
        k = int(labels.max()) + 1
        before = np.bincount(labels, minlength=k)
        after = np.bincount(labels[sel.rows], minlength=k)
        plots.cluster_sizes(before, after, plot_dir / "cluster_sizes.png")
    plots.weight_histogram(sel.weights, plot_dir / "weights.png")


def check_features_current(cfg) -> None:
    """Features must come from the current data.train (its digest is in the features
    manifest) and the clusters from the current features (their digest is in the cluster
    metrics). Refused before any selection is written."""
    import json

    from clusterft.artifacts import file_digest

    path = cfg.artifact("features", "manifest.json")
    made_from = json.loads(path.read_text()).get("data_digest") if path.exists() else None
    if made_from and made_from != file_digest(cfg.data.train):
        raise SelectionError(
            f"{path}: the features were computed from another version of {cfg.data.train}; "
            "rerun warmup, features and cluster on the current data (`dvc repro` does)")
    metrics, feats = cfg.artifact("cluster", "metrics.json"), cfg.artifact("features", "features.npy")
    made_from = json.loads(metrics.read_text()).get("features_digest") if metrics.exists() else None
    if made_from and feats.exists() and made_from != file_digest(feats):
        raise SelectionError(
            f"{cfg.artifact('cluster', 'labels.npy')}: the clusters were computed from another version "
            f"of {feats}; rerun cluster (`dvc repro` does)")


def _choose(cfg, method: str, budget: float, n: int, groups: np.ndarray, labels, centers) -> tuple[Selection, dict]:
    """The method's selection under `budget`, and its per-epoch quota per cluster."""
    from clusterft.artifacts import load_npy

    s = cfg.select
    if METHODS[method].budget is None:  # full; infobatch prunes during training, not before
        sel = select_full(n)
    elif method == "random":
        sel = select_random(n, budget, s.seed)
    elif method == "cluster_dynamic":
        sel, quotas = select_cluster_dynamic(labels, len(centers), budget, s.split, s.tau, s.alpha,
                                             groups if s.dedup else None, s.fill)
        return sel, quotas
    elif method == "cluster":
        sel = select_cluster(labels, load_npy(cfg.artifact("features", "features.npy"), mmap=True), centers,
                             budget, s.seed, s.within, s.alpha, s.split, s.tau, groups if s.dedup else None,
                             s.fill)
    elif method == "cluster_paper":
        sel = select_cluster_paper(load_npy(cfg.artifact("features", "features.npy")), cfg.train.nproc,
                                   s.paper_ratio, s.seed)
    else:
        raise SelectionError(f"unknown select method {method!r}")
    # a static selection trains its own counts every epoch
    return sel, {int(c): int(q) for c, q in zip(*np.unique(sel.clusters, return_counts=True))}


def _epoch_chars(cfg, sel: Selection, chars: np.ndarray) -> float:
    """Characters a batch of the selection (a dynamic run: of its pool) pads to."""
    from clusterft.probe import padded_chars

    return padded_chars(chars[sel.rows], cfg.train.per_device_batch, cfg.train.seed)


def _epoch_plan_s(cfg, sel: Selection, quotas: dict, chars: np.ndarray) -> float:
    """Seconds cluster_dynamic spends building one epoch's plan (a steady one, timed here)."""
    import time

    from clusterft.dynamic import ClusterDynamicSource

    t = cfg.train
    src = ClusterDynamicSource(sel.clusters, quotas, chars[sel.rows], t.nproc, t.per_device_batch, 2, t.seed, 0)
    src.epoch_plan(0)  # the first call pays one-off costs
    start = time.perf_counter()
    src.epoch_plan(1)
    return time.perf_counter() - start


def time_plan(cfg, method: str, tm, chars: np.ndarray, k: int, elapsed_s: float, chars_sel: float | None = None,
              per_epoch_s: float = 0.0):
    """The TimePlan for select.time_budget: the probe's time model `tm`, the paid selection
    stages plus `elapsed_s` of select so far, at least max(k, nproc) samples per epoch;
    `chars`: every train sample's characters; batches padded as the data's unless `chars_sel`
    (padded characters of the selection) is given. TimeBudgetError when it cannot fit."""
    from clusterft.methods import paid_stages
    from clusterft.probe import padded_chars
    from clusterft.stages import shared_times
    from clusterft.timebudget import plan_time_budget

    s, t = cfg.select, cfg.train
    done = shared_times(cfg)
    spent = sum(done[st] for st in paid_stages(method, s.time_budget)) + elapsed_s
    chars_all = padded_chars(chars, t.per_device_batch, t.seed)
    return plan_time_budget(s.time_budget, tm, spent, len(chars), chars_all, chars_sel or chars_all, t.epochs,
                            max(k, t.nproc), METHODS[method].allocation == "dynamic", per_epoch_s)


def train_chars(examples: list) -> np.ndarray:
    """Characters of every train sample (what a time plan sizes batches by)."""
    from clusterft.probe import sample_chars

    return np.array([sample_chars(e) for e in examples], dtype=np.float64)


def _time_planned(cfg, method: str, examples: list, choose, k: int, started: float):
    """Selection, quotas and TimePlan for select.time_budget: plan at the data's sample
    sizes, select, then re-plan at the selection's own (and dynamic epoch cost)."""
    import time

    from clusterft.probe import read_probe
    from clusterft.timebudget import TimeModel

    n = len(examples)
    tm, chars = TimeModel.from_probe(read_probe(cfg)), train_chars(examples)
    plan = time_plan(cfg, method, tm, chars, k, time.perf_counter() - started)

    def as_budget(m: int) -> float:
        return float(m) if m > 1 else 1.0 / n

    sel, quotas = choose(as_budget(plan.samples_per_epoch))
    dynamic = METHODS[method].allocation == "dynamic"
    per_epoch = _epoch_plan_s(cfg, sel, quotas, chars) if dynamic else 0.0
    again = time_plan(cfg, method, tm, chars, k, time.perf_counter() - started, _epoch_chars(cfg, sel, chars),
                      per_epoch)
    if again.samples_per_epoch != plan.samples_per_epoch:
        sel, quotas = choose(as_budget(again.samples_per_epoch))
    return sel, quotas, again


def cluster_count(cfg) -> int:
    """Non-empty clusters of the cluster stage's labels."""
    from clusterft.artifacts import load_npy

    return int(len(np.unique(load_npy(cfg.artifact("cluster", "labels.npy")))))


def _asked(method: str, budget: float, n: int, planned) -> int | None:
    """Samples per epoch the data budget (or the time plan) asks of `method`; None: it has
    no data budget (full, infobatch; cluster_paper's ratio is a cut, not a count)."""
    if METHODS[method].budget != "select.budget":
        return None
    return planned.samples_per_epoch if planned else budget_count(budget, n)


def run_select(cfg, method: str, run: str | None = None) -> dict:
    """Stage `select`: writes methods/<method>/selection.jsonl, quotas.json (per-epoch quota
    per cluster; the epochs when a time budget chose them) and select_metrics.json (with the
    time plan under a time budget)."""
    import time

    from clusterft.artifacts import load_npy, write_json
    from clusterft.data import load_examples
    from clusterft.methods import time_budgeted

    start = time.perf_counter()
    examples = load_examples(cfg, "train")
    ids = [e.id for e in examples]
    n = len(ids)
    groups = duplicate_groups([f"{e.prompt}\n{e.response}" for e in examples])
    s = cfg.select
    if method in ("cluster", "cluster_dynamic", "cluster_paper"):
        check_features_current(cfg)
    labels = centers = None
    if method in ("cluster", "cluster_dynamic"):
        labels = load_npy(cfg.artifact("cluster", "labels.npy"))
        if len(labels) != n:
            raise SelectionError(
                f"{cfg.artifact('cluster', 'labels.npy')}: {len(labels)} labels for {n} train samples; "
                "rerun features and cluster on the current data"
            )
        centers = load_npy(cfg.artifact("cluster", "centers.npy"))

    def choose(budget: float) -> tuple[Selection, dict]:
        return _choose(cfg, method, budget, n, groups, labels, centers)

    planned, epochs = None, cfg.train.epochs
    if time_budgeted(method, s.time_budget):
        k = int(len(np.unique(labels))) if labels is not None else 0
        sel, quotas, planned = _time_planned(cfg, method, examples, choose, k, start)
        epochs = planned.epochs
    else:
        sel, quotas = choose(s.budget)
    out = cfg.method_dir(method, run)
    write_selection(out / "selection.jsonl", sel, ids)
    planned_epochs = {"epochs": epochs} if planned else {}  # else train.epochs, as for every method
    write_json(out / "quotas.json", {"per_epoch": sum(quotas.values()), "quotas": quotas, **planned_epochs})
    metrics = {
        "method": method,
        "n_train": n,
        "n_selected": int(len(sel.rows)),
        "trained_per_epoch": sum(quotas.values()),
        "epochs": epochs,
        "kept_fraction": sum(quotas.values()) / n,  # trained per epoch
        "budget_samples": _asked(method, s.budget, n, planned),
        "n_distinct_train": int(len(np.unique(groups))),  # distinct prompt + answer pairs
        "kept_distinct": int(len(np.unique(groups[sel.rows]))),
        "weight_min": float(sel.weights.min()),
        "weight_max": float(sel.weights.max()),
        **({"time_plan": planned.record()} if planned else {}),
        "wall_clock_s": time.perf_counter() - start,  # the plots below are not part of the cost
    }
    write_json(out / "select_metrics.json", metrics)
    _plot_selection(cfg, sel, out / "plots")
    return metrics
