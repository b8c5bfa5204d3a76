"""`cluster_dynamic`: a fresh balanced subset every epoch. Each cluster keeps its quota
(as `cluster` does), but the samples inside a cluster rotate: an epoch draws from the
cluster's samples not used yet in the current cycle, and a cycle ends when the cluster is
used up. Optionally part of each quota goes to the cluster's samples whose latest loss is
highest (InfoBatch's signal, kept inside the quota). Each epoch's allocation plan is built
when the epoch starts (coverage and token balance as for `cluster`), so a long run never
holds every epoch's plan; resume restores the epoch's draw and continues mid-epoch.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from clusterft.core.allocation import AllocationPlan, build_plan


class ClusterDynamicSource:
    """Yields (epoch, step, rank indices, global step size, rescale) over a selection pool.

    clusters: [M] cluster of each pool sample; quotas: {cluster: samples per epoch};
    lengths: [M] tokens (the plan's balance); hard: fraction of each quota filled with the
    highest-loss unused samples (0 = pure rotation)."""

    def __init__(self, clusters: np.ndarray, quotas: dict[int, int], lengths: np.ndarray, world: int,
                 per_device_batch: int, epochs: int, seed: int, rank: int, hard: float = 0.0,
                 mode: str = "balanced"):
        self.clusters = np.asarray(clusters, dtype=np.int64)
        self.n, self.world, self.batch, self.epochs = len(self.clusters), world, per_device_batch, epochs
        self.seed, self.rank, self.hard = seed, rank, hard  # seed, n, world, batch, epochs: plan_stub
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.members = {int(c): np.flatnonzero(self.clusters == c) for c in np.unique(self.clusters)}
        self.quotas = {int(c): int(min(q, len(self.members.get(int(c), [])))) for c, q in quotas.items()}
        self.per_epoch = sum(self.quotas.values())
        self.used = np.zeros(self.n, dtype=bool)  # used in the current cycle of its cluster
        self.scores = np.full(self.n, np.inf)  # latest loss; unseen samples count as hardest
        self.draw: list[int] = []  # the current epoch's samples (restored on resume)
        self.draw_epoch = -1
        self.kept_per_epoch: list[int] = []
        self.needs_losses = hard > 0
        self.mode = mode  # each epoch's plan: build_plan mode
        self.identity = repr((sorted(self.quotas.items()), hard, mode))  # in the checkpoint's run digest

    @property
    def total_steps(self) -> int:
        return self.epochs * max(1, self.per_epoch // (self.world * self.batch))

    def _take(self, c: int, q: int, rng: np.random.Generator) -> np.ndarray:
        """q samples of cluster c: unused ones first (hardest `hard` share, then random);
        when the cycle runs out, a new cycle starts over the cluster's other samples."""
        members = self.members[c]
        out: list[np.ndarray] = []
        while q > 0:
            free = members[~self.used[members]]
            if len(free) == 0:
                taken = np.concatenate(out) if out else np.zeros(0, np.int64)
                self.used[members] = False
                self.used[taken] = True  # not twice in one epoch
                free = members[~self.used[members]]
                if len(free) == 0:
                    break
            n_hard = min(len(free), int(round(self.hard * q)))
            order = np.lexsort((rng.random(len(free)), -self.scores[free]))  # ties (unseen): random
            hard = free[order[:n_hard]]
            rest = np.setdiff1d(free, hard)
            pick = np.concatenate([hard, rng.permutation(rest)[: min(q, len(free)) - n_hard]])
            self.used[pick] = True
            out.append(pick)
            q -= len(pick)
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def _new_draw(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, epoch])
        return np.sort(np.concatenate([self._take(c, q, rng) for c, q in sorted(self.quotas.items())]))

    def batches(self, start_epoch: int = 0, resumed: bool = False
                ) -> Iterator[tuple[int, int, np.ndarray, int, np.ndarray]]:
        """From `start_epoch`; when resumed, that epoch reuses the draw it started with."""
        del self.kept_per_epoch[start_epoch:]
        for e in range(start_epoch, self.epochs):
            if not (resumed and e == start_epoch):
                self.draw_epoch = -1  # a fresh draw (a resumed epoch keeps the one it started with)
            draw, plan = self.epoch_plan(e)
            self.kept_per_epoch.append(len(draw))
            sizes = plan.step_sizes()[0]
            for _, s, idx in plan.rank_batches(self.rank):
                yield e, s, idx, int(sizes[s]), np.ones(len(idx))

    def epoch_plan(self, epoch: int) -> tuple[np.ndarray, AllocationPlan]:
        """(the epoch's draw, its one-epoch plan over pool indices): coverage and token
        balance as `allocate` gives a static selection."""
        if self.draw_epoch != epoch:
            self.draw, self.draw_epoch = self._new_draw(epoch).tolist(), epoch
        draw = np.asarray(self.draw, dtype=np.int64)
        plan = build_plan(self.clusters[draw], self.world, self.batch, 1, self.seed * 100003 + epoch,
                          self.mode, self.lengths[draw])
        table = plan.table.copy()
        table[:, 3] = draw[table[:, 3]]
        return draw, AllocationPlan(table, plan.world_size, 1, plan.steps_per_epoch)

    def observe(self, idx: np.ndarray, losses: np.ndarray) -> None:
        self.scores[idx] = losses

    def state_dict(self) -> dict:
        return {"used": np.flatnonzero(self.used).tolist(), "scores": self.scores.tolist(),
                "draw": list(self.draw), "draw_epoch": self.draw_epoch, "kept_per_epoch": self.kept_per_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.used[:] = False
        self.used[np.asarray(state["used"], dtype=np.int64)] = True
        self.scores = np.asarray(state["scores"], dtype=np.float64)
        self.draw, self.draw_epoch = list(state["draw"]), int(state["draw_epoch"])
        self.kept_per_epoch = list(state["kept_per_epoch"])
