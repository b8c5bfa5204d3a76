"""Stage `train`: weighted data-parallel fine-tuning of one method's selection along its
allocation plan (torchrun + DDP or FSDP), with checkpoints that resume and live tracking.
The loop is runtime.loop; checkpoints are runtime.checkpoint.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from clusterft.core.allocation import AllocationPlan
from clusterft.core.curves import eval_steps
from clusterft.core.infobatch import InfoBatchSource
from clusterft.core.losses import ResponseLoss
from clusterft.core.tokens import encode_all, truncation_report
from clusterft.errors import AllocationError
from clusterft.io.artifacts import atomic_write_text, file_digest, read_json, write_json
from clusterft.io.records import dynamic_source, load_plan, read_selection
from clusterft.report.tracking import LiveTraining
from clusterft.runtime import distributed, parallel
from clusterft.runtime.data import load_examples
from clusterft.runtime.generation import validation_point
from clusterft.runtime.loop import gather_rank_timings, train_on_plan, wait_summary
from clusterft.runtime.model import build_model, plain_model, save_trained
from clusterft.spec.methods import METHODS

log = logging.getLogger(__name__)


def check_plan(mdir: Path, world_size: int) -> AllocationPlan:
    """The method folder's plan, refused (AllocationError) when it is missing, was built from
    another selection.jsonl (its digest is in plan.json) or for another number of workers."""
    if not (mdir / "plan.npy").exists():
        raise AllocationError(f"{mdir / 'plan.npy'}: no allocation plan; run `clusterft allocate` first")
    made_from = read_json(mdir / "plan.json").get("selection_digest")
    if made_from and (mdir / "selection.jsonl").exists() and made_from != file_digest(mdir / "selection.jsonl"):
        raise AllocationError(f"{mdir / 'plan.npy'}: the plan was built from another version of "
                              f"{mdir / 'selection.jsonl'}; rerun `clusterft allocate` (`dvc repro` does)")
    plan = load_plan(mdir)
    if plan.world_size != world_size:
        raise AllocationError(
            f"{mdir / 'plan.npy'}: plan is for {plan.world_size} workers but training runs "
            f"{world_size}; rerun `clusterft allocate` with train.nproc={world_size}")
    return plan


def check_train_inputs(cfg: Any, method: str, run: str | None = None) -> None:
    """What would fail the same way on every rank and every restart (bad data, a missing or
    mismatched plan), checked once before torchrun starts: refused, never retried."""
    mdir = cfg.method_dir(method, run)
    check_plan(mdir, cfg.train.nproc)
    read_selection(mdir / "selection.jsonl")
    load_examples(cfg, "train")


def batch_source(cfg: Any, method: str, mdir: Path, plan: AllocationPlan, sel: dict, lengths: np.ndarray,
                 info: Any) -> Any:
    """What this rank trains: the static plan, or a source that draws each epoch's batches
    while training (InfoBatch's pruning, cluster_dynamic's rotation)."""
    t = cfg.train
    if METHODS[method].allocation == "infobatch":
        return InfoBatchSource(len(lengths), info.world_size, t.per_device_batch, t.epochs, t.seed, info.rank,
                               t.infobatch_prune)
    if METHODS[method].allocation == "dynamic":
        return dynamic_source(cfg, mdir, np.asarray(sel["cluster"]), lengths, info.rank)
    return plan


def run_train(cfg: Any, method: str, run: str | None = None) -> dict:
    """Stage `train`: follows methods/<m>/plan.npy; writes model/, train_metrics.json."""
    start = time.perf_counter()
    info = distributed.init_distributed(timeout_s=cfg.train.timeout_s)
    mdir = cfg.method_dir(method, run)
    plan = check_plan(mdir, info.world_size)
    sel = read_selection(mdir / "selection.jsonl")
    examples = load_examples(cfg, "train")
    model, tokenizer = build_model(cfg, info.device)
    encoded = encode_all([examples[r] for r in sel["row"]], tokenizer, cfg.data.max_length)
    truncation = truncation_report(encoded, "train (selected)", cfg.data.max_length) if info.is_main else {}
    model = parallel.wrap(model, cfg.train.strategy, info, cfg.train.precision)
    source = batch_source(cfg, method, mdir, plan, sel, np.array([e.n_tokens for e in encoded]), info)
    live = LiveTraining(cfg, method, run or method, len(encoded)) if info.is_main and cfg.tracking.live else None
    curve = CurveHook(cfg, model, tokenizer, info, source.total_steps, start, live)
    history = train_on_plan(model, encoded, np.asarray(sel["weight"]), source, cfg.train, info,
                            tokenizer.pad_token_id, checkpoint_dir=mdir / "checkpoint", on_step=curve.on_step)
    loop_end = time.perf_counter()
    finish_eval_s = curve.finish(history)
    loop_s = history[-1]["clock_s"]  # the training loop's seconds, over a resume, evaluation excluded
    per_rank = gather_rank_timings(history)
    trained = plain_model(cfg, model, info)
    metrics: dict[str, Any] = {}
    if info.is_main:
        for h, timings in zip(history, per_rank):
            h.update(timings)
        save_trained(trained, tokenizer, mdir / "model")
        metrics = {"method": method, "world_size": info.world_size, "backend": info.backend or "none",
                   "strategy": cfg.train.strategy if info.world_size > 1 else "single", "train_loop_s": loop_s,
                   "machine": distributed.machine(),
                   "truncation": truncation, **run_summary(history, source, plan), **curve_summary(history),
                   "wall_clock_s": curve.setup_s + loop_s + time.perf_counter() - loop_end - finish_eval_s}
        if live is not None:
            metrics["mlflow_run_id"] = live.finish(metrics, mdir / "model")
        atomic_write_text(mdir / "train_log.jsonl", "".join(json.dumps(h) + "\n" for h in history))
        shutil.rmtree(mdir / "checkpoint", ignore_errors=True)  # the run is complete
        write_json(mdir / "train_metrics.json", metrics)
    distributed.barrier()
    distributed.cleanup()
    return metrics


class CurveHook:
    """The step hook of a training run: with evaluate.every, a validation point (exact match,
    held-out loss) after the steps eval_steps names, written into that step's record (so a
    resumed run keeps its curve) with the training seconds so far (this attempt's setup plus
    the loop's clock, which a resume carries on), evaluation excluded; then live tracking.
    on_step and finish return the seconds they spent evaluating; `setup_s` is this attempt's
    time before the loop."""

    def __init__(self, cfg: Any, model: Any, tokenizer: Any, info: Any, total_steps: int, start: float,
                 live: LiveTraining | None):
        self.cfg, self.model, self.tokenizer, self.info, self.live = cfg, model, tokenizer, info, live
        self.points = set(eval_steps(total_steps, cfg.evaluate.every))
        self.validation = load_examples(cfg, "validation") if self.points else []
        self.loss = ResponseLoss(parallel.unwrap(model))  # checked against full logits once, then reused
        self.setup_s = time.perf_counter() - start

    def on_step(self, g: int, rec: dict) -> float:
        """Returns the seconds spent evaluating (kept off the training clock)."""
        spent = self._point(g, rec) if g in self.points else 0.0
        if self.live is not None:
            self.live.on_step(g, rec)
        return spent

    def finish(self, history: list[dict]) -> float:
        """A last point at the run's real end when the schedule's step count was an estimate
        (InfoBatch prunes a number of samples known only while it trains); returns the seconds
        spent evaluating, as on_step does."""
        if self.points and history and "val_macro_em" not in history[-1]:
            return self._point(len(history), history[-1])
        return 0.0

    def _point(self, g: int, rec: dict) -> float:
        t0 = time.perf_counter()
        rec.update(validation_point(self.model, self.tokenizer, self.validation, self.cfg, self.info, self.loss))
        rec["train_s"] = self.setup_s + rec["clock_s"]
        rec["eval_s"] = time.perf_counter() - t0
        if self.info.is_main:
            log.info("step %d: validation macro EM %.3f, held-out loss %.4f (%.1f s to evaluate)", g,
                     rec["val_macro_em"], rec["val_heldout_loss"], rec["eval_s"])
        return rec["eval_s"]


def curve_summary(history: list[dict]) -> dict[str, Any]:
    """The run's validation curve (its points from the step records) and what it cost."""
    points = [{**{k: h[k] for k in ("step", "train_s", "val_macro_em", "val_worst_skill_em", "val_heldout_loss")},
               "val_skill_em": h.get("val_skill_em", {})}  # absent from points logged before it was kept
              for h in history if "val_macro_em" in h]
    if not points:
        return {}
    return {"curve": [{**p, "step": p["step"] + 1} for p in points],
            "eval_during_train_s": float(sum(h["eval_s"] for h in history if "eval_s" in h))}


def run_summary(history: list[dict], source: Any, plan: AllocationPlan) -> dict[str, Any]:
    """A finished run's figures from its step records: steps, loss at the end, throughput,
    memory, compute vs sync per rank, and the samples trained in each epoch."""
    tail = history[-max(1, len(history) // 10):]
    return {
        "steps": len(history),
        "samples_seen_rank0": sum(h["samples"] for h in history),
        "final_loss": float(np.mean([h["weighted_loss"] for h in tail])),
        "tokens_per_s_rank0": float(np.sum([h["tokens"] for h in history])
                                    / max(1e-9, np.sum([h["compute_s"] for h in history]))),
        "peak_mem_mb_rank0": float(max((h["peak_mem_mb"] for h in history), default=0.0)),
        "loss_path_rank0": " then ".join(dict.fromkeys(h.get("loss_path", "full logits") for h in history))
        or "full logits",  # in order: the shared prefix may be taken up after the first batch
        **wait_summary(history),
        "samples_trained_per_epoch": getattr(source, "kept_per_epoch", None)
        or [int(x) for x in plan.step_sizes().sum(1)],
    }
