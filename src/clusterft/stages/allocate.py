"""Stage `allocate`: the plan of which selected sample each rank trains at each step
(plan.npy), with its quality next to a shuffled DistributedSampler's on the same selection:
per-step coverage, the worst drift of a cluster over a stretch of steps, token balance."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from clusterft.core.allocation import build_plan, plan_metrics, rank_cluster_counts
from clusterft.core.tokens import encode_all
from clusterft.io.artifacts import file_digest, write_json
from clusterft.io.records import dynamic_source, read_selection, save_plan
from clusterft.report import plots
from clusterft.runtime.data import load_examples
from clusterft.runtime.model import base_model_dir, load_tokenizer
from clusterft.spec.methods import METHODS


def plan_mode(method: str, clusters: np.ndarray, clustered_mode: str = "balanced") -> str:
    """The allocation a selection method trains with: a clustered selection's is
    `clustered_mode` (train.allocation), an unclustered one is shuffled."""
    if METHODS[method].allocation == "rank_per_cluster":
        return "rank_per_cluster"
    return clustered_mode if (np.asarray(clusters) >= 0).any() else "shuffle"


def run_allocate(cfg: Any, method: str, run: str | None = None) -> dict:
    """Stage `allocate`: plan for methods/<method>/selection.jsonl over train.nproc ranks,
    with metrics for the plan and for a shuffled DistributedSampler on the same selection."""
    start = time.perf_counter()
    out = cfg.method_dir(method, run)
    sel = read_selection(out / "selection.jsonl")
    clusters = np.asarray(sel["cluster"], dtype=np.int64)
    examples = load_examples(cfg, "train")
    tokenizer = load_tokenizer(base_model_dir(cfg), cfg.model)
    lengths = np.array([e.n_tokens for e in encode_all([examples[r] for r in sel["row"]], tokenizer,
                                                        cfg.data.max_length)])
    t = cfg.train
    mode = plan_mode(method, clusters, t.allocation)
    if METHODS[method].allocation == "dynamic":  # each epoch's plan is built in training; epoch 0 here
        source = dynamic_source(cfg, out, clusters, lengths, 0)
        mode, plan, epochs = "dynamic", source.epoch_plan(0)[1], source.epochs
    else:
        epochs = t.epochs
        plan = build_plan(clusters, t.nproc, t.per_device_batch, t.epochs, t.seed, mode, lengths)
    save_plan(out, plan, {"mode": mode, "selection_digest": file_digest(out / "selection.jsonl")})
    seconds = time.perf_counter() - start  # diagnostics and plots below are not part of the cost
    baseline = build_plan(clusters, t.nproc, t.per_device_batch, 1, t.seed, "shuffle", lengths)
    metrics = {
        "method": method, "mode": mode, "world_size": plan.world_size, "epochs": epochs,
        "steps_per_epoch": plan.steps_per_epoch, "total_steps": epochs * plan.steps_per_epoch,
        **plan_metrics(plan, clusters, lengths),
        **{f"shuffled_{k}": v for k, v in plan_metrics(baseline, clusters, lengths).items()},
        "wall_clock_s": seconds,
    }
    write_json(out / "allocate_metrics.json", metrics)
    plots.allocation_heatmap(rank_cluster_counts(plan, clusters), out / "plots" / "allocation.png")
    return metrics
