"""Data budget from a time budget: how many samples (and, for `cluster_dynamic`, how many
epochs) fit in `select.time_budget`, given the selection stages already spent and the
training throughput the `probe` stage measured on the real training setup.

A fraction (<= 1) is of the estimated full-data training time; a value above 1 is seconds.
Both cover the whole run a user waits for: selection stages, select, allocate and train.
The probe's own arithmetic (steps of similar-size samples, least squares of step cost on
padded characters) is here too.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from clusterft.core.allocation import AllocationPlan
from clusterft.errors import TimeBudgetError


@dataclass(frozen=True)
class TimeModel:
    """Training cost measured by the probe: fixed seconds + seconds per sample-epoch.

    setup_s: train stage start to its first step (data, model, wrapping), without tokenising;
    encode_s: tokenising one sample (train and allocate each do it); first_step_s: the first
    step's extra cost; a steady step of `samples_per_step` samples costs step_fixed_s +
    step_per_char_s x the characters each rank's batch is padded to; checkpoint_s: one
    resumable checkpoint, taken every `checkpoint_every` steps (0: none); save_s: the end;
    tracking_s: live MLflow tracking (0 when off)."""

    setup_s: float
    encode_s: float
    first_step_s: float
    step_fixed_s: float
    step_per_char_s: float
    checkpoint_s: float
    checkpoint_every: int
    save_s: float
    tracking_s: float
    samples_per_step: int

    @classmethod
    def from_probe(cls, m: dict[str, Any]) -> "TimeModel":
        return cls(**{k: m[k] for k in cls.__dataclass_fields__})

    def sample_epoch_s(self, chars: float) -> float:
        """Seconds one sample costs per epoch in steps whose batches pad to `chars` characters."""
        return (self.step_fixed_s + self.step_per_char_s * chars) / self.samples_per_step

    def fixed_s(self) -> float:
        return self.setup_s + self.first_step_s + self.save_s + self.tracking_s

    def checkpoints_s(self, m: int, epochs: int) -> float:
        """The checkpoints of a run of m samples per epoch (steps as `allocate` plans them)."""
        if not self.checkpoint_every:
            return 0.0
        steps = epochs * max(1, m // self.samples_per_step)
        return self.checkpoint_s * (steps // self.checkpoint_every)

    def train_s(self, m: int, epochs: int, chars: float, per_epoch_s: float = 0.0) -> float:
        """Estimated train stage seconds for m samples per epoch over `epochs` epochs."""
        return (self.fixed_s() + self.encode_s * m + epochs * (m * self.sample_epoch_s(chars) + per_epoch_s)
                + self.checkpoints_s(m, epochs))

    def allocate_s(self, m: int) -> float:
        """Estimated allocate stage seconds (it tokenises the selection)."""
        return self.encode_s * m


@dataclass(frozen=True)
class TimePlan:
    """The data budget chosen for a time budget, and what it was planned from."""

    requested: float          # select.time_budget as given
    target_s: float           # the time budget in seconds
    full_train_s: float       # estimated full-data train stage seconds
    spent_s: float            # selection stages + probe + select so far
    samples_per_epoch: int
    epochs: int
    planned_train_s: float
    planned_end_to_end_s: float

    def record(self) -> dict[str, Any]:
        return asdict(self)


def plan_time_budget(requested: float, tm: TimeModel, spent_s: float, n: int, chars_all: float,
                     chars_sel: float, epochs: int, min_per_epoch: int, may_cut_epochs: bool,
                     per_epoch_s: float = 0.0) -> TimePlan:
    """The most samples per epoch (at most n) whose end-to-end time fits `requested`.

    The epochs stay `epochs`; when `may_cut_epochs` (cluster_dynamic: each epoch draws a
    fresh subset) and fewer than `min_per_epoch` samples would fit, fewer epochs are run
    instead. Refused (TimeBudgetError) when even `min_per_epoch` samples for one epoch (or
    for `epochs`, without `may_cut_epochs`) do not fit; the message gives the smallest
    budget that does, in the unit the user gave."""
    full = tm.train_s(n, epochs, chars_all)
    target = requested * full if requested <= 1 else float(requested)
    ckpt = tm.checkpoint_s / (tm.samples_per_step * tm.checkpoint_every) if tm.checkpoint_every else 0.0
    unit = tm.sample_epoch_s(chars_sel) + ckpt  # checkpoints spread over the samples of their steps

    def end_to_end(m: int, e: int) -> float:
        return spent_s + tm.allocate_s(m) + tm.train_s(m, e, chars_sel, per_epoch_s)

    def most(e: int) -> int:
        """The most samples per epoch (<= n) that fit over e epochs; below min when none."""
        left = target - spent_s - tm.fixed_s() - e * per_epoch_s
        m = int(min(n, math.floor(max(0.0, left) / (e * unit + 2 * tm.encode_s))))
        while m > 0 and end_to_end(m, e) > target:  # exact: whole steps and checkpoints
            m -= 1
        while m < n and end_to_end(m + 1, e) <= target:
            m += 1
        return m

    e = epochs
    m = most(e)
    if m < min_per_epoch and may_cut_epochs:  # fewer epochs, each with the samples that then fit
        e = max(1, min(epochs, int((target - spent_s - tm.fixed_s() - 2 * tm.encode_s * min_per_epoch)
                                   // (min_per_epoch * unit + per_epoch_s))))
        while e > 1 and end_to_end(min_per_epoch, e) > target:
            e -= 1
        m = most(e)
    if m < min_per_epoch or end_to_end(m, e) > target * (1 + 1e-9):
        e_min = 1 if may_cut_epochs else epochs
        need = end_to_end(min_per_epoch, e_min)
        if requested <= 1 and need <= full:  # rounded up: the value shown fits
            smallest = f"{math.ceil(need / full * 1e4) / 1e4:.4f} (of the estimated {full:.1f} s full-data training)"
        else:  # seconds; a fraction above 1 would read as seconds
            smallest = f"{math.ceil(need * 10) / 10:.1f} (seconds; the full-data training is estimated at {full:.1f} s)"
        raise TimeBudgetError(
            f"select.time_budget={requested:g} ({target:.1f} s) cannot be met: the selection stages "
            f"already took {spent_s:.1f} s, training setup and saving take {tm.fixed_s():.1f} s, and the "
            f"smallest run ({min_per_epoch} samples per epoch for {e_min} epoch(s)) needs "
            f"{need - spent_s - tm.fixed_s():.1f} s more; the smallest time budget that fits is {smallest}")
    return TimePlan(requested, target, full, spent_s, m, e, tm.train_s(m, e, chars_sel, per_epoch_s),
                    end_to_end(m, e))


def sample_chars(example: Any) -> int:
    """A sample's size in characters (a step's cost grows with its longest sample's)."""
    return len(example.prompt) + len(example.response)


def padded_chars(chars: np.ndarray, per_device_batch: int, seed: int = 0, draws: int = 256) -> float:
    """Mean characters a rank's batch is padded to (its longest sample), over random batches
    of `per_device_batch` samples: what a step's cost grows with."""
    chars = np.asarray(chars, dtype=np.float64)
    b = min(per_device_batch, len(chars))
    rng = np.random.default_rng(seed)
    return float(np.mean([chars[rng.choice(len(chars), size=b, replace=False)].max() for _ in range(draws)]))


def length_steps(chars: np.ndarray, world: int, per_device_batch: int, seed: int) -> tuple[Any, np.ndarray]:
    """A one-epoch plan whose steps each hold samples of similar size, from the shortest to
    the longest step in random order, and each step's padded characters (mean over ranks of
    the longest sample): step times over that range separate a step's fixed cost from its
    cost per padded character."""
    per_step = world * per_device_batch
    steps = len(chars) // per_step
    buckets = np.argsort(chars, kind="stable")[: steps * per_step].reshape(steps, per_step)
    buckets = buckets[np.random.default_rng(seed).permutation(steps)]
    table = np.array([(0, s, j % world, i) for s, b in enumerate(buckets) for j, i in enumerate(b)], dtype=np.int64)
    table = table[np.lexsort((table[:, 3], table[:, 2], table[:, 1]))]
    padded = np.array([[chars[b[j::world]].max() for j in range(world)] for b in buckets]).mean(axis=1)
    return AllocationPlan(table, world, 1, steps), padded


def step_cost(step_chars: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """(fixed seconds, seconds per padded character) of a step: least squares, both kept >= 0
    (a small model's step is mostly fixed cost, a large one's grows with its tokens)."""
    if len(seconds) >= 2 and np.ptp(step_chars) > 0:
        per_char, fixed = np.polyfit(step_chars, seconds, 1)
        if per_char >= 0 and fixed >= 0:
            return float(fixed), float(per_char)
        if per_char < 0:
            return float(seconds.mean()), 0.0
    return 0.0, float(seconds.mean() / max(1e-9, step_chars.mean()))
