"""DP allocation: which selected sample each rank trains at each step of each epoch.

A plan is an int64 array of rows (epoch, step, rank, index) where `index` is a line of the
selection JSONL. `stratified` spreads every cluster evenly over the epoch so each global
step carries every cluster in proportion to its share; `shuffle` is the plain
DistributedSampler baseline (a random permutation dealt to ranks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PLAN_COLUMNS = ("epoch", "step", "rank", "index")


class AllocationError(ValueError):
    """The plan cannot be built for these workers; the message says why."""


@dataclass
class AllocationPlan:
    table: np.ndarray  # [rows, 4] int64, columns PLAN_COLUMNS, sorted
    world_size: int
    epochs: int
    steps_per_epoch: int

    def rank_batches(self, rank: int):
        """Yield (epoch, step, indices) for one rank, in training order."""
        t = self.table[self.table[:, 2] == rank]
        for e in range(self.epochs):
            te = t[t[:, 0] == e]
            bounds = np.searchsorted(te[:, 1], np.arange(self.steps_per_epoch + 1))
            for s in range(self.steps_per_epoch):
                yield e, s, te[bounds[s] : bounds[s + 1], 3]

    def step_sizes(self) -> np.ndarray:
        """[epochs, steps] samples per global step (all ranks)."""
        out = np.zeros((self.epochs, self.steps_per_epoch), dtype=np.int64)
        np.add.at(out, (self.table[:, 0], self.table[:, 1]), 1)
        return out


def _stratified_order(clusters: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Order where each cluster's members sit at evenly spaced positions (j + u_k) / m_k."""
    pos = np.empty(len(clusters))
    for c in np.unique(clusters):
        members = np.flatnonzero(clusters == c)
        members = rng.permutation(members)
        pos[members] = (np.arange(len(members)) + rng.random()) / len(members)
    return np.lexsort((clusters, pos))


def build_plan(
    clusters: np.ndarray,
    world_size: int,
    per_device_batch: int,
    epochs: int,
    seed: int,
    mode: str = "stratified",
) -> AllocationPlan:
    """Every selected sample once per epoch; equal-size steps (+-1); every rank >= 1 per step."""
    m = len(clusters)
    if world_size > m:
        raise AllocationError(
            f"train.nproc={world_size} workers but only {m} selected samples: "
            "every worker needs at least one sample per step"
        )
    global_batch = world_size * per_device_batch
    steps = max(1, m // global_batch)
    rng = np.random.default_rng(seed)
    rows = []
    for e in range(epochs):
        if mode == "stratified":
            order = _stratified_order(np.asarray(clusters), rng)
        elif mode == "shuffle":
            order = rng.permutation(m)
        else:
            raise AllocationError(f"unknown allocation mode {mode!r}")
        for s, chunk in enumerate(np.array_split(order, steps)):
            chunk = rng.permutation(chunk)  # so no rank is pinned to one cluster
            ranks = np.arange(len(chunk)) % world_size
            rows.append(np.column_stack([np.full(len(chunk), e), np.full(len(chunk), s), ranks, chunk]))
    table = np.concatenate(rows).astype(np.int64)
    table = table[np.lexsort((table[:, 3], table[:, 2], table[:, 1], table[:, 0]))]
    return AllocationPlan(table, world_size, epochs, steps)


def coverage_error(plan: AllocationPlan, clusters: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Per global step, max over clusters of |count - target|, target = step size x share."""
    clusters = np.asarray(clusters)
    ks = np.unique(clusters)
    share = np.array([(clusters == k).mean() for k in ks])
    errs = []
    for e in range(plan.epochs):
        te = plan.table[plan.table[:, 0] == e]
        for s in range(plan.steps_per_epoch):
            idx = te[te[:, 1] == s, 3]
            counts = np.array([(clusters[idx] == k).sum() for k in ks])
            errs.append(np.abs(counts - len(idx) * share).max())
    return np.array(errs)


def save_plan(out_dir, plan: AllocationPlan, extra: dict | None = None) -> None:
    """plan.npy (int64 rows epoch, step, rank, index) + plan.json manifest."""
    from pathlib import Path

    from clusterft.artifacts import save_npy, write_json

    out = Path(out_dir)
    save_npy(out / "plan.npy", plan.table)
    write_json(out / "plan.json", {
        "columns": list(PLAN_COLUMNS), "world_size": plan.world_size, "epochs": plan.epochs,
        "steps_per_epoch": plan.steps_per_epoch, **(extra or {}),
    })


def load_plan(out_dir) -> AllocationPlan:
    from pathlib import Path

    from clusterft.artifacts import load_npy, read_json

    out = Path(out_dir)
    meta = read_json(out / "plan.json")
    return AllocationPlan(load_npy(out / "plan.npy"), meta["world_size"], meta["epochs"],
                          meta["steps_per_epoch"])


def run_allocate(cfg, method: str) -> dict:
    """Stage `allocate`: plan for methods/<method>/selection.jsonl over train.nproc ranks."""
    import time

    from clusterft.artifacts import write_json
    from clusterft.selection import read_selection

    start = time.perf_counter()
    out = cfg.artifact("methods", method)
    sel = read_selection(out / "selection.jsonl")
    clusters = np.asarray(sel["cluster"], dtype=np.int64)
    mode = "stratified" if (clusters >= 0).any() else "shuffle"
    t = cfg.train
    plan = build_plan(clusters, t.nproc, t.per_device_batch, t.epochs, t.seed, mode)
    cov = coverage_error(plan, clusters) if mode == "stratified" else np.zeros(1)
    metrics = {
        "method": method, "mode": mode, "world_size": plan.world_size, "epochs": plan.epochs,
        "steps_per_epoch": plan.steps_per_epoch, "total_steps": plan.epochs * plan.steps_per_epoch,
        "coverage_error_max": float(cov.max()), "coverage_error_mean": float(cov.mean()),
        "wall_clock_s": time.perf_counter() - start,
    }
    save_plan(out, plan, {"mode": mode})
    write_json(out / "allocate_metrics.json", metrics)
    return metrics
