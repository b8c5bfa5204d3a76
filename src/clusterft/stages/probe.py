"""Stage `probe`: time a few steps of the real training setup (torchrun, train.nproc ranks,
the train section's model, precision, strategy, batch and checkpoints) on random train
samples, so a time budget (`select.time_budget`) can be turned into a data budget. Steps
are timed from the end of one to the end of the next (the loop's own work included), and
a couple of checkpoint saves and live MLflow tracking apart. Off (a skip record, one process) while
select.time_budget is 0; a setup already timed is not timed again (delete
probe/metrics.json to re-measure).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from clusterft.core.timebudget import length_steps, padded_chars, sample_chars, step_cost
from clusterft.core.tokens import encode_all
from clusterft.io.artifacts import ensure_dir, read_json, write_json
from clusterft.io.timings import probe_digest
from clusterft.report.tracking import LiveTraining
from clusterft.runtime import distributed, parallel
from clusterft.runtime.data import load_examples
from clusterft.runtime.loop import train_on_plan
from clusterft.runtime.model import build_model, plain_model, save_trained


def tracking_cost(cfg: Any, n: int, out: Path, save_s: float) -> float:
    """Seconds live MLflow tracking adds to a training run: its run opened (params, datasets)
    and finished, timed on a throwaway run, plus copying the model (as long as saving it)."""
    empty = ensure_dir(out / "empty")
    start = time.perf_counter()
    live = LiveTraining(cfg, "probe", "probe", n)
    live.finish({"probe": 1.0}, empty)
    seconds = time.perf_counter() - start + save_s
    if live.client is not None and live.run_id:
        live.client.delete_run(live.run_id)  # not a training run: kept out of the MLflow UI
    shutil.rmtree(empty, ignore_errors=True)
    return seconds


def run_probe(cfg: Any) -> dict[str, Any]:
    """Stage `probe`: writes probe/metrics.json (setup, per-step, tokenising and saving seconds)."""
    start = time.perf_counter()
    out = cfg.artifact("probe")
    if not cfg.select.time_budget:
        metrics = {"skipped": True, "wall_clock_s": 0.0}
        write_json(out / "metrics.json", metrics)
        return metrics
    kept = read_json(out / "metrics.json") if (out / "metrics.json").exists() else {}
    if not kept.get("skipped") and kept.get("digest") == probe_digest(cfg):
        return kept  # this setup is timed already: a new time budget re-plans from the same figures
    t = cfg.train
    info = distributed.init_distributed(timeout_s=t.timeout_s)
    examples = load_examples(cfg, "train")
    per_step = info.world_size * t.per_device_batch
    size = per_step * cfg.select.probe_steps
    rows = np.random.default_rng(t.seed).choice(len(examples), size=size, replace=size > len(examples))
    model, tokenizer = build_model(cfg, info.device)
    t_enc = time.perf_counter()
    encoded = encode_all([examples[r] for r in rows], tokenizer, cfg.data.max_length)
    encode_s = (time.perf_counter() - t_enc) / len(rows)
    model = parallel.wrap(model, t.strategy, info, t.precision)
    timed = {"setup_s": time.perf_counter() - start - encode_s * len(rows), "encode_s": encode_s,
             **_time_steps(cfg, model, tokenizer, encoded, [sample_chars(examples[r]) for r in rows], info)}
    trained = plain_model(cfg, model, info)
    metrics: dict[str, Any] = {}
    if info.is_main:
        shutil.rmtree(out / "checkpoint", ignore_errors=True)
        t_save = time.perf_counter()
        save_trained(trained, tokenizer, out / "model")
        save_s = time.perf_counter() - t_save
        shutil.rmtree(out / "model", ignore_errors=True)
        tracking_s = tracking_cost(cfg, len(rows), out, save_s) if cfg.tracking.live else 0.0
        metrics = {"digest": probe_digest(cfg), "world_size": info.world_size, **timed,
                   "checkpoint_every": t.checkpoint_every, "save_s": save_s, "tracking_s": tracking_s,
                   "samples_per_step": per_step, "wall_clock_s": time.perf_counter() - start}
        write_json(out / "metrics.json", metrics)
    distributed.barrier()
    distributed.cleanup()
    return metrics


def _time_steps(cfg: Any, model: Any, tokenizer: Any, encoded: list, sizes: list[int], info: Any) -> dict:
    """Train steps of similar-size samples (short to long, in random order) and a couple of
    checkpoints, stamping each step's end; the step cost (fixed + per padded character) and
    the first step's extra, fitted on the gaps without a save; a checkpoint's seconds, timed
    around the save itself (a gap minus a step is too noisy for a small model's saves)."""
    t = cfg.train
    chars = np.array(sizes, dtype=np.float64)
    plan, step_chars = length_steps(chars, info.world_size, t.per_device_batch, t.seed)
    every = max(2, cfg.select.probe_steps // 3) if t.checkpoint_every else 0  # two or three timed saves
    ckpt = cfg.artifact("probe", "checkpoint")
    if info.is_main:
        shutil.rmtree(ckpt, ignore_errors=True)  # never resume an old probe: its steps would go untimed
    distributed.barrier()
    stamps: list[float] = []
    t_loop = time.perf_counter()
    settings = t.model_copy(update={"log_every": 10**9, "checkpoint_every": every})
    history = train_on_plan(model, encoded, np.ones(len(encoded)), plan, settings, info, tokenizer.pad_token_id,
                            checkpoint_dir=ckpt if every else None,
                            on_step=lambda g, rec: stamps.append(time.perf_counter()))
    saves = [h["checkpoint_s"] for h in history if "checkpoint_s" in h]  # timed where they ran (rank 0)
    # interval g (stamp g-1 -> g) holds step g+1 and, after a checkpoint step, that save
    gaps = np.diff(np.array(stamps))
    after_save = np.array([every > 0 and (g + 1) % every == 0 for g in range(len(gaps))])
    fixed, per_char = step_cost(step_chars[1:][~after_save], gaps[~after_save])
    padded = padded_chars(chars, t.per_device_batch, t.seed)
    step_s = fixed + per_char * padded  # a step of random samples
    return {"steps": len(stamps), "first_step_s": max(0.0, stamps[0] - t_loop - step_s), "step_s": step_s,
            "step_fixed_s": fixed, "step_per_char_s": per_char,
            "checkpoint_s": float(np.mean(saves)) if saves else 0.0,
            "padded_chars": padded}
