"""DP allocation: which selected sample each rank trains at each step of each epoch.

A plan is an int64 array of rows (epoch, step, rank, index) where `index` is a line of the
selection JSONL. Modes:
- `balanced` (ours): each global step holds every cluster within one sample of its share,
  and so does every stretch of steps from the epoch's start (an exact matrix rounding of
  steps x clusters with bounded running sums, solved as a max-flow); each epoch starts at
  a random step of that rounding (a rotation: any stretch stays within two samples), so a
  small cluster is spread evenly and never pinned to the same steps. Inside a step samples
  go to ranks by longest-processing-time on token counts (equal token loads).
- `per_step`: the earlier rounding, balanced inside each step only: a cluster smaller than
  the step count may be trained in a block of consecutive steps (kept for comparison).
- `shuffle`: the plain DistributedSampler baseline (random permutation, rank r takes
  every R-th sample).
- `rank_per_cluster`: the paper's reference allocation, rank k trains only cluster k.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clusterft.errors import AllocationError

PLAN_COLUMNS = ("epoch", "step", "rank", "index")
MODES = ("balanced", "per_step", "shuffle", "rank_per_cluster")

@dataclass
class AllocationPlan:
    table: np.ndarray  # [rows, 4] int64, columns PLAN_COLUMNS, sorted
    world_size: int
    epochs: int
    steps_per_epoch: int

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

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


def step_cluster_counts(cluster_sizes: np.ndarray, step_sizes: np.ndarray) -> np.ndarray:
    """[S, K] integer counts with row sums = step sizes and column sums = cluster sizes.

    Every entry is the floor or ceiling of step_size * cluster_size / total (each step holds
    every cluster within one sample of its share), and so is every column's running sum
    over steps 1..s against its share of the samples in those steps (no cluster drifts
    ahead or behind over the epoch). Rows and running sums are two laminar families, so the
    constraint matrix is totally unimodular and such a rounding always exists; it is found
    as a feasible flow with lower bounds (max-flow).
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    m = np.asarray(cluster_sizes, dtype=np.int64)
    b = np.asarray(step_sizes, dtype=np.int64)
    total = int(m.sum())
    s_n, k_n = len(b), len(m)
    base = np.outer(b, m) // total
    up = (np.outer(b, m) % total) != 0  # cells that may take one more than their floor
    need_row = b - base.sum(1)
    if need_row.sum() == 0:
        return base
    cum = np.outer(np.cumsum(b), m)  # running share * total
    lo = cum // total - np.cumsum(base, 0)  # bounds on each cluster's running count of +1s
    hi = -(-cum // total) - np.cumsum(base, 0)
    # Nodes: step s; chain (s, k) carries cluster k's running +1 count out of step s.
    step = 1 + np.arange(s_n)
    chain = 1 + s_n + np.arange(s_n * k_n).reshape(s_n, k_n)
    src, dst = 0, 1 + s_n + s_n * k_n
    excess = np.zeros(dst + 1, np.int64)  # lower bounds moved into supplies and demands
    excess[step] += need_row
    ss, kk = np.nonzero(up)
    rows = [step[ss], chain[:-1].ravel()]
    cols = [chain[ss, kk], chain[1:].ravel()]
    caps = [np.ones(len(ss), np.int64), (hi - lo)[:-1].ravel()]
    np.add.at(excess, chain[:-1].ravel(), -lo[:-1].ravel())
    np.add.at(excess, chain[1:].ravel(), lo[:-1].ravel())
    excess[chain[-1]] -= lo[-1]
    pos, neg = np.flatnonzero(excess > 0), np.flatnonzero(excess < 0)
    rows += [np.zeros(len(pos), np.int64), neg]
    cols += [pos, np.full(len(neg), dst)]
    caps += [excess[pos], -excess[neg]]
    r, c, w = (np.concatenate(x) for x in (rows, cols, caps))
    keep = w > 0
    graph = csr_matrix((w[keep].astype(np.int32), (r[keep], c[keep])), shape=(dst + 1, dst + 1))
    flow = maximum_flow(graph, src, dst)
    if flow.flow_value != excess[pos].sum():  # cannot happen (total unimodularity); guard the theorem
        raise AllocationError("internal: no step/cluster rounding meets its margins")
    f = flow.flow.tocsr()
    extra = np.asarray(f[step[ss], chain[ss, kk]]).ravel().clip(min=0)
    out = base.copy()
    out[ss, kk] += extra
    if (out.sum(1) != b).any() or (out.sum(0) != m).any():
        raise AllocationError("internal: step/cluster rounding did not meet its margins")
    return out


def per_step_cluster_counts(cluster_sizes: np.ndarray, step_sizes: np.ndarray) -> np.ndarray:
    """The `per_step` rounding: every entry the floor or ceiling of step_size * cluster_size
    / total, margins exact, nothing said about running sums (the max-flow may put a small
    cluster's samples in consecutive steps)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    m = np.asarray(cluster_sizes, dtype=np.int64)
    b = np.asarray(step_sizes, dtype=np.int64)
    total = int(m.sum())
    prod = np.outer(b, m)
    base = prod // total
    frac = (prod % total) != 0
    need_row = b - base.sum(1)
    need_col = m - base.sum(0)
    s_n, k_n = base.shape
    if need_row.sum() == 0:
        return base
    src, sink = 0, 1 + s_n + k_n
    ss, kk = np.nonzero(frac)
    rows = np.concatenate([np.zeros(s_n, int), 1 + ss, 1 + s_n + np.arange(k_n)])
    cols = np.concatenate([1 + np.arange(s_n), 1 + s_n + kk, np.full(k_n, sink)])
    caps = np.concatenate([need_row, np.ones(len(ss), int), need_col]).astype(np.int32)
    graph = csr_matrix((caps, (rows, cols)), shape=(sink + 1, sink + 1))
    flow = maximum_flow(graph, src, sink).flow.tocsr()
    extra = np.asarray(flow[1 : 1 + s_n, 1 + s_n : 1 + s_n + k_n].todense()).clip(min=0)
    out = base + extra.astype(np.int64)
    if (out.sum(1) != b).any() or (out.sum(0) != m).any():  # cannot happen; guard the theorem
        raise AllocationError("internal: step/cluster rounding did not meet its margins")
    return out


def lpt_assign(lengths: np.ndarray, clusters: np.ndarray, world: int, seen: np.ndarray) -> np.ndarray:
    """Rank per item: longest item first to the least-loaded rank (ties: the rank that has
    seen this item's cluster least this epoch, then the lowest rank). Updates `seen`."""
    load = np.zeros(world, dtype=np.int64)
    ranks = np.empty(len(lengths), dtype=np.int64)
    for i in np.lexsort((np.arange(len(lengths)), -lengths)):
        c = clusters[i]
        r = int(np.lexsort((np.arange(world), seen[:, c], load))[0])
        ranks[i] = r
        load[r] += lengths[i]
        seen[r, c] += 1
    return ranks


def _check(m: int, world: int) -> None:
    if world > m:
        raise AllocationError(
            f"train.nproc={world} workers but only {m} selected samples: "
            "every worker needs at least one sample per step"
        )


def build_plan(
    clusters: np.ndarray,
    world_size: int,
    per_device_batch: int,
    epochs: int,
    seed: int,
    mode: str = "balanced",
    lengths: np.ndarray | None = None,
) -> AllocationPlan:
    """Every selected sample once per epoch; steps of equal size (+-1); each rank >= 1 per step.

    clusters: [M] cluster id per selected sample (-1 when unclustered); lengths: [M] tokens
    (None: all equal, so balance means equal counts).
    """
    clusters = np.asarray(clusters, dtype=np.int64)
    m = len(clusters)
    _check(m, world_size)
    lengths = np.ones(m, np.int64) if lengths is None else np.asarray(lengths, np.int64)
    rng = np.random.default_rng(seed)
    if mode == "rank_per_cluster":
        return _rank_per_cluster(clusters, world_size, per_device_batch, epochs, rng)
    if mode not in MODES:
        raise AllocationError(f"unknown allocation mode {mode!r}; known: {MODES}")
    steps = max(1, m // (world_size * per_device_batch))
    step_sizes = np.array([len(c) for c in np.array_split(np.arange(m), steps)])
    ids, inverse = np.unique(clusters, return_inverse=True)
    sizes = np.bincount(inverse, minlength=len(ids))
    if mode == "balanced":
        counts = step_cluster_counts(sizes, step_sizes)
    elif mode == "per_step":
        counts = per_step_cluster_counts(sizes, step_sizes)
    rows = []
    for e in range(epochs):
        if mode == "shuffle":
            order = rng.permutation(m)
            start = 0
            for s, size in enumerate(step_sizes):
                chunk = order[start : start + size]
                start += size
                rows.append(_rows(e, s, np.arange(size) % world_size, chunk))
            continue
        epoch_counts = np.roll(counts, -int(rng.integers(steps)), axis=0) if mode == "balanced" else counts
        members = [rng.permutation(np.flatnonzero(inverse == k)) for k in range(len(ids))]
        cursor = np.zeros(len(ids), dtype=np.int64)
        seen = np.zeros((world_size, len(ids)), dtype=np.int64)
        for s in range(steps):
            chunk = np.concatenate([members[k][cursor[k] : cursor[k] + epoch_counts[s, k]] for k in range(len(ids))])
            cursor += epoch_counts[s]
            ranks = lpt_assign(lengths[chunk], inverse[chunk], world_size, seen)
            rows.append(_rows(e, s, ranks, chunk))
    return _plan(rows, world_size, epochs, steps)


def _rows(epoch: int, step: int, ranks: np.ndarray, idx: np.ndarray) -> np.ndarray:
    n = len(idx)
    return np.column_stack([np.full(n, epoch), np.full(n, step), ranks, idx])


def _plan(rows: list[np.ndarray], world: int, epochs: int, steps: int) -> AllocationPlan:
    table = np.concatenate(rows).astype(np.int64)
    table = table[np.lexsort((table[:, 3], table[:, 2], table[:, 1], table[:, 0]))]
    return AllocationPlan(table, world, epochs, steps)


def _rank_per_cluster(clusters, world, per_device_batch, epochs, rng) -> AllocationPlan:
    """The paper's allocation: cluster k (0..world-1) is trained by rank k only."""
    present = set(np.unique(clusters).tolist())
    if present != set(range(world)):
        raise AllocationError(
            f"rank_per_cluster needs clusters 0..{world - 1} (one per rank), got {sorted(present)}"
        )
    sizes = np.bincount(clusters, minlength=world)
    steps = max(1, int(sizes.min()) // per_device_batch)
    rows = []
    for e in range(epochs):
        for k in range(world):
            members = rng.permutation(np.flatnonzero(clusters == k))
            for s, chunk in enumerate(np.array_split(members, steps)):
                rows.append(_rows(e, s, np.full(len(chunk), k), chunk))
    return _plan(rows, world, epochs, steps)


def prefix_discrepancy(plan: AllocationPlan, clusters: np.ndarray) -> float:
    """Worst drift of a cluster over a stretch of steps from an epoch's start, in samples:
    max over epochs, clusters k and steps s of |samples of k in steps 1..s - its share of
    the samples in those steps|. A plan that trains a small cluster in a block of steps
    scores about the cluster's size; a random order about sqrt of it."""
    ids, inv = np.unique(np.asarray(clusters), return_inverse=True)
    t = plan.table
    worst = 0.0
    for e in range(plan.epochs):
        te = t[t[:, 0] == e]
        counts = np.zeros((plan.steps_per_epoch, len(ids)))
        np.add.at(counts, (te[:, 1], inv[te[:, 3]]), 1)
        run = counts.cumsum(0)
        share = run.sum(1, keepdims=True) * run[-1] / run[-1].sum()
        worst = max(worst, float(np.abs(run - share).max()))
    return worst


def plan_metrics(plan: AllocationPlan, clusters: np.ndarray, lengths: np.ndarray) -> dict[str, float]:
    """Coverage error (per step, averaged over steps, and the worst running drift over an
    epoch), rank token imbalance (max/mean), padded-cost imbalance, padding fraction and
    rank x cluster coverage of a plan."""
    clusters = np.asarray(clusters)
    lengths = np.asarray(lengths)
    ids, inv = np.unique(clusters, return_inverse=True)
    share = np.bincount(inv, minlength=len(ids)) / len(inv)
    t = plan.table
    w = plan.world_size
    cov, tok_imb, pad_imb = [], [], []
    real = padded = 0
    for e in range(plan.epochs):
        te = t[t[:, 0] == e]
        bounds = np.searchsorted(te[:, 1], np.arange(plan.steps_per_epoch + 1))
        for s in range(plan.steps_per_epoch):
            st = te[bounds[s] : bounds[s + 1]]
            idx, ranks = st[:, 3], st[:, 2]
            counts = np.bincount(inv[idx], minlength=len(ids))
            cov.append(np.abs(counts - len(idx) * share).max())
            tokens = np.bincount(ranks, weights=lengths[idx], minlength=w)
            n_r = np.bincount(ranks, minlength=w)
            max_len = np.zeros(w)
            np.maximum.at(max_len, ranks, lengths[idx])
            cost = n_r * max_len
            tok_imb.append(tokens.max() / tokens.mean())
            pad_imb.append(cost.max() / cost.mean())
            real += tokens.sum()
            padded += cost.sum()
    first = t[t[:, 0] == 0]
    seen = np.zeros((w, len(ids)), bool)
    seen[first[:, 2], inv[first[:, 3]]] = True
    big = np.bincount(inv, minlength=len(ids)) >= w
    return {
        "coverage_error_max": float(np.max(cov)),
        "coverage_error_mean": float(np.mean(cov)),
        "prefix_discrepancy_max": prefix_discrepancy(plan, clusters),
        "token_imbalance_mean": float(np.mean(tok_imb)),
        "token_imbalance_max": float(np.max(tok_imb)),
        "padded_imbalance_mean": float(np.mean(pad_imb)),
        "padding_fraction": float(1 - real / padded),
        "rank_cluster_coverage": float(seen[:, big].mean()) if big.any() else 1.0,
    }


def rank_cluster_counts(plan: AllocationPlan, clusters: np.ndarray) -> np.ndarray:
    """[ranks, clusters] samples each rank trains from each cluster in epoch 0."""
    ids, inv = np.unique(np.asarray(clusters), return_inverse=True)
    first = plan.table[plan.table[:, 0] == 0]
    out = np.zeros((plan.world_size, len(ids)), dtype=np.int64)
    np.add.at(out, (first[:, 2], inv[first[:, 3]]), 1)
    return out
