"""Stage `probe`: time a few steps of the real training setup (torchrun, train.nproc ranks,
the train section's model, precision, strategy, batch and checkpoints) on random train
samples, so a time budget (`select.time_budget`) can be turned into a data budget. Steps
are timed from the end of one to the end of the next (the loop's own work included), and
a couple of checkpoint saves and live MLflow tracking apart. Off (a skip record, one process) while
select.time_budget is 0; a setup already timed is not timed again (delete
probe/metrics.json to re-measure).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from clusterft.selection import SelectionError


def probe_digest(cfg: Any) -> str:
    """Hash of what sets training speed (not seeds or the learning rate) and of the train data."""
    import hashlib
    import json
    from pathlib import Path

    from clusterft.config import to_dict
    from clusterft.stages import PROBE_TRAIN_KEYS

    speed = {k: getattr(cfg.train, k) for k in PROBE_TRAIN_KEYS if k not in ("seed", "timeout_s")}
    doc = {"train": speed, "lora": to_dict(cfg.lora), "model": to_dict(cfg.model), "data": to_dict(cfg.data),
           "steps": cfg.select.probe_steps}
    h = hashlib.sha1(json.dumps(doc, sort_keys=True).encode())
    p = Path(cfg.data.train)
    h.update(p.read_bytes() if p.exists() else b"-")
    return h.hexdigest()


def read_probe(cfg: Any) -> dict[str, Any]:
    """The probe's measurements for the current training setup; refused when missing,
    skipped or made for another setup."""
    from clusterft.artifacts import read_json

    path = cfg.artifact("probe", "metrics.json")
    m = read_json(path) if path.exists() else {"skipped": True}
    if m.get("skipped"):
        raise SelectionError(f"{path}: select.time_budget needs the training probe; run `clusterft probe` "
                             "with select.time_budget set (`dvc repro` does)")
    if m.get("digest") != probe_digest(cfg):
        raise SelectionError(f"{path}: the probe timed another training setup or data; rerun "
                             "`clusterft probe` (`dvc repro` does)")
    return m


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
    from clusterft.allocation import AllocationPlan

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


def tracking_cost(cfg: Any, n: int, out: Any, save_s: float) -> float:
    """Seconds live MLflow tracking adds to a training run: its run opened (params, datasets)
    and finished, timed on a throwaway run, plus copying the model (as long as saving it)."""
    import shutil

    from clusterft.artifacts import ensure_dir
    from clusterft.tracking import LiveTraining

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
    import shutil

    from clusterft import distributed
    from clusterft.artifacts import read_json, write_json
    from clusterft.data import encode_all, load_examples
    from clusterft.train import _build_model, plain_model, save_trained
    from clusterft.train_loop import train_on_plan

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
    model, tokenizer = _build_model(cfg, info.device)
    t_enc = time.perf_counter()
    encoded = encode_all([examples[r] for r in rows], tokenizer, cfg.data.max_length)
    encode_s = (time.perf_counter() - t_enc) / len(rows)
    from clusterft import parallel

    model = parallel.wrap(model, t.strategy, info, t.precision)
    setup_s = time.perf_counter() - start - encode_s * len(rows)
    chars = np.array([sample_chars(examples[r]) for r in rows], dtype=np.float64)
    plan, step_chars = length_steps(chars, info.world_size, t.per_device_batch, t.seed)
    every = max(2, cfg.select.probe_steps // 3) if t.checkpoint_every else 0  # two or three timed saves
    ckpt = out / "checkpoint"
    if info.is_main:
        shutil.rmtree(ckpt, ignore_errors=True)  # never resume an old probe: its steps would go untimed
    distributed.barrier()
    stamps: list[float] = []
    t_loop = time.perf_counter()
    train_on_plan(model, encoded, np.ones(len(rows)), plan, info.rank, tokenizer.pad_token_id, t.lr,
                  t.warmup_ratio, t.weight_decay, log_every=10**9, device=info.device,
                  checkpoint_dir=ckpt if every else None, checkpoint_every=every,
                  world_size=info.world_size, on_step=lambda g, rec: stamps.append(time.perf_counter()),
                  optimizer_name=t.optimizer, precision=t.precision, grad_accum=t.grad_accum,
                  micro_batch_tokens=t.micro_batch_tokens)
    # interval g (stamp g-1 -> g) holds step g+1 and, after a checkpoint step, that save
    gaps = np.diff(np.array(stamps))
    after_save = np.array([every > 0 and (g + 1) % every == 0 for g in range(len(gaps))])
    fixed, per_char = step_cost(step_chars[1:][~after_save], gaps[~after_save])
    padded = padded_chars(chars, t.per_device_batch, t.seed)
    step_s = fixed + per_char * padded  # a step of random samples
    trained = plain_model(cfg, model, info)
    metrics: dict[str, Any] = {}
    if info.is_main:
        shutil.rmtree(ckpt, ignore_errors=True)
        t_save = time.perf_counter()
        save_trained(trained, tokenizer, out / "model")
        save_s = time.perf_counter() - t_save
        shutil.rmtree(out / "model", ignore_errors=True)
        tracking_s = tracking_cost(cfg, len(rows), out, save_s) if cfg.tracking.live else 0.0
        metrics = {
            "digest": probe_digest(cfg), "world_size": info.world_size, "steps": len(stamps),
            "setup_s": setup_s, "encode_s": encode_s,
            "first_step_s": max(0.0, stamps[0] - t_loop - step_s), "step_s": step_s,
            "step_fixed_s": fixed, "step_per_char_s": per_char,
            "checkpoint_s": max(0.0, float(gaps[after_save].mean()) - step_s) if after_save.any() else 0.0,
            "checkpoint_every": t.checkpoint_every, "save_s": save_s, "tracking_s": tracking_s,
            "samples_per_step": per_step,
            "padded_chars": padded,
            "wall_clock_s": time.perf_counter() - start,
        }
        write_json(out / "metrics.json", metrics)
    distributed.barrier()
    distributed.cleanup()
    return metrics
