"""InfoBatch baseline (Qin et al., ICLR 2024): dynamic pruning during training.

Each epoch (except the last 12.5%), a random fraction `prune` of the samples whose latest
loss is below the mean is skipped, and the kept below-mean samples are up-weighted by
1 / (1 - prune) so the expected gradient is unchanged. Losses are shared across ranks
every step, so every rank builds the same epoch plan.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np


class InfoBatchSource:
    """Yields (epoch, step, rank indices, global step size, per-index loss rescale)."""

    def __init__(self, n: int, world: int, per_device_batch: int, epochs: int, seed: int, rank: int,
                 prune: float = 0.5, anneal: float = 0.875):
        if not 0 <= prune < 1:
            raise ValueError(f"train.infobatch_prune must be in [0, 1), got {prune}")
        self.n, self.world, self.batch, self.epochs = n, world, per_device_batch, epochs
        self.seed, self.rank, self.prune = seed, rank, prune
        self.last_pruned_epoch = int(np.floor(anneal * epochs))  # epochs >= this train on all
        self.scores = np.ones(n)  # latest loss per sample; 1 until first seen (as InfoBatch)
        self.epoch_scores = self.scores.copy()
        self.kept_per_epoch: list[int] = []
        self.identity = repr(("infobatch", prune, anneal))  # in the checkpoint's run digest

    @property
    def total_steps(self) -> int:
        """Expected optimizer steps (for the lr schedule). Epoch 0 has no losses yet (every
        score is equal, none below the mean), so it trains on all; in the later pruned epochs
        about half the samples sit below the mean."""
        g = self.world * self.batch
        full = max(1, self.n // g)
        pruned = max(1, int(self.n * (1 - self.prune / 2)) // g)
        prunable = max(0, self.last_pruned_epoch - 1)
        return prunable * pruned + (self.epochs - prunable) * full

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Kept sample order and per-sample rescale for one epoch."""
        rng = np.random.default_rng([self.seed, epoch])
        rescale = np.ones(self.n)
        keep = np.ones(self.n, dtype=bool)
        if epoch < self.last_pruned_epoch and self.prune > 0:
            well = self.epoch_scores < self.epoch_scores.mean()
            drop = well & (rng.random(self.n) < self.prune)
            keep = ~drop
            rescale[well & keep] = 1.0 / (1.0 - self.prune)
        order = rng.permutation(np.flatnonzero(keep))
        if len(order) < self.world:  # every rank needs a sample: top up with dropped ones
            order = np.concatenate([order, rng.permutation(np.flatnonzero(~keep))[: self.world - len(order)]])
        return order, rescale

    def batches(self, start_epoch: int = 0, resumed: bool = False
                ) -> Iterator[tuple[int, int, np.ndarray, int, np.ndarray]]:
        """From `start_epoch`; when resumed, that epoch keeps the scores it started with."""
        del self.kept_per_epoch[start_epoch:]
        for e in range(start_epoch, self.epochs):
            if not (resumed and e == start_epoch):
                self.epoch_scores = self.scores.copy()
            order, rescale = self._epoch(e)
            self.kept_per_epoch.append(len(order))
            steps = max(1, len(order) // (self.world * self.batch))
            for s, chunk in enumerate(np.array_split(order, steps)):
                mine = chunk[np.arange(len(chunk)) % self.world == self.rank]
                yield e, s, mine, len(chunk), rescale[mine]

    needs_losses = True

    def observe(self, idx: np.ndarray, losses: np.ndarray) -> None:
        self.scores[idx] = losses

    def state_dict(self) -> dict:
        return {"scores": self.scores.tolist(), "epoch_scores": self.epoch_scores.tolist(),
                "kept_per_epoch": list(self.kept_per_epoch)}

    def load_state_dict(self, state: dict) -> None:
        self.scores = np.asarray(state["scores"])
        self.epoch_scores = np.asarray(state["epoch_scores"])
        self.kept_per_epoch = list(state["kept_per_epoch"])
