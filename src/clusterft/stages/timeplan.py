"""A time budget (`select.time_budget`) turned into a data budget for `select`: the probe's
time model, the selection stages already paid, the selection's own sample sizes and, for
cluster_dynamic, the cost of building each epoch's plan."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from clusterft.core.dynamic import ClusterDynamicSource
from clusterft.core.selection import Selection
from clusterft.core.timebudget import TimeModel, TimePlan, padded_chars, plan_time_budget, sample_chars
from clusterft.io.artifacts import load_npy
from clusterft.io.timings import read_probe, shared_times
from clusterft.spec.methods import METHODS, paid_stages


def _epoch_chars(cfg: Any, sel: Selection, chars: np.ndarray) -> float:
    """Characters a batch of the selection (a dynamic run: of its pool) pads to."""
    return padded_chars(chars[sel.rows], cfg.train.per_device_batch, cfg.train.seed)


def _epoch_plan_s(cfg: Any, sel: Selection, quotas: dict, chars: np.ndarray) -> float:
    """Seconds cluster_dynamic spends building one epoch's plan (a steady one, timed here)."""
    t = cfg.train
    src = ClusterDynamicSource(sel.clusters, quotas, chars[sel.rows], t.nproc, t.per_device_batch, 2, t.seed, 0,
                               mode=t.allocation)
    src.epoch_plan(0)  # the first call pays one-off costs
    start = time.perf_counter()
    src.epoch_plan(1)
    return time.perf_counter() - start


def time_plan(cfg: Any, method: str, tm: TimeModel, chars: np.ndarray, k: int, elapsed_s: float,
              chars_sel: float | None = None, per_epoch_s: float = 0.0) -> TimePlan:
    """The TimePlan for select.time_budget: the probe's time model `tm`, the paid selection
    stages plus `elapsed_s` of select so far, at least max(k, nproc) samples per epoch;
    `chars`: every train sample's characters; batches padded as the data's unless `chars_sel`
    (padded characters of the selection) is given. TimeBudgetError when it cannot fit."""
    s, t = cfg.select, cfg.train
    done = shared_times(cfg)
    spent = sum(done[st] for st in paid_stages(method, s.time_budget)) + elapsed_s
    chars_all = padded_chars(chars, t.per_device_batch, t.seed)
    return plan_time_budget(s.time_budget, tm, spent, len(chars), chars_all, chars_sel or chars_all, t.epochs,
                            max(k, t.nproc), METHODS[method].allocation == "dynamic", per_epoch_s)


def train_chars(examples: list) -> np.ndarray:
    """Characters of every train sample (what a time plan sizes batches by)."""
    return np.array([sample_chars(e) for e in examples], dtype=np.float64)


def time_planned(cfg: Any, method: str, examples: list, choose: Callable[[float], tuple[Selection, dict]],
                 k: int, started: float) -> tuple[Selection, dict, TimePlan]:
    """Selection, quotas and TimePlan for select.time_budget: plan at the data's sample
    sizes, select, then re-plan at the selection's own (and dynamic epoch cost)."""
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


def cluster_count(cfg: Any) -> int:
    """Non-empty clusters of the cluster stage's labels."""
    return int(len(np.unique(load_npy(cfg.artifact("cluster", "labels.npy")))))
