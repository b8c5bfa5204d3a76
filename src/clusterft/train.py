"""Stage `train`: weighted data-parallel fine-tuning of one method's selection along its
allocation plan (torchrun + DDP), with checkpoints that resume and live tracking. The loop
is `clusterft.train_loop`; checkpoints are `clusterft.checkpoint`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterft.methods import METHODS
from clusterft.train_loop import gather_rank_timings, train_on_plan, wait_summary


def _build_model(cfg: Any, device: torch.device) -> tuple[Any, Any]:
    """The model as the run starts it: base weights, activation checkpointing, LoRA."""
    from clusterft.model import add_lora, base_model_dir, load_model, load_tokenizer

    base = base_model_dir(cfg)
    tokenizer = load_tokenizer(base, cfg.model)
    torch.manual_seed(cfg.train.seed)
    model = load_model(base, cfg.model)
    if cfg.train.activation_checkpointing:  # non-reentrant: works with frozen (LoRA) inputs
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.train.finetune == "lora":
        model = add_lora(model, cfg.lora)
    return model.to(device), tokenizer


def save_trained(model: Any, tokenizer: Any, out_dir: Path) -> None:
    """Save a plain HF folder (LoRA merged in) with safetensors weights, atomically."""
    import shutil

    from clusterft.artifacts import ensure_dir

    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    ensure_dir(tmp)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)


def plain_model(cfg: Any, model: Any, info: Any) -> Any:
    """The trained model as one plain module on rank 0 (FSDP shards gathered; collective)."""
    from clusterft import parallel

    if not parallel.is_sharded(model):
        return parallel.unwrap(model)
    weights = parallel.full_state_dict(model)
    if not info.is_main:
        return None
    trained = _build_model(cfg, torch.device("cpu"))[0]
    trained.load_state_dict(weights)
    return trained


def check_plan(mdir: Path, world_size: int) -> Any:
    """The method folder's plan, refused (AllocationError) when it is missing, was built from
    another selection.jsonl (its digest is in plan.json) or for another number of workers."""
    from clusterft.allocation import AllocationError, load_plan
    from clusterft.artifacts import file_digest, read_json

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
    from clusterft.data import load_examples
    from clusterft.selection import read_selection

    mdir = cfg.method_dir(method, run)
    check_plan(mdir, cfg.train.nproc)
    read_selection(mdir / "selection.jsonl")
    load_examples(cfg, "train")


def run_train(cfg: Any, method: str, run: str | None = None) -> dict:
    """Stage `train`: follows methods/<m>/plan.npy; writes model/, train_metrics.json."""
    import shutil

    from clusterft import distributed, parallel
    from clusterft.artifacts import atomic_write_text, write_json
    from clusterft.data import encode_all, load_examples, truncation_report
    from clusterft.selection import read_selection
    from clusterft.tracking import LiveTraining

    start = time.perf_counter()
    info = distributed.init_distributed(timeout_s=cfg.train.timeout_s)
    mdir = cfg.method_dir(method, run)
    plan = check_plan(mdir, info.world_size)
    sel = read_selection(mdir / "selection.jsonl")
    examples = load_examples(cfg, "train")
    model, tokenizer = _build_model(cfg, info.device)
    encoded = encode_all([examples[r] for r in sel["row"]], tokenizer, cfg.data.max_length)
    truncation = truncation_report(encoded, "train (selected)", cfg.data.max_length) if info.is_main else {}
    model = parallel.wrap(model, cfg.train.strategy, info, cfg.train.precision)
    loop_start = time.perf_counter()
    source: Any = plan
    if METHODS[method].allocation == "infobatch":
        from clusterft.infobatch import InfoBatchSource

        source = InfoBatchSource(len(encoded), info.world_size, cfg.train.per_device_batch, cfg.train.epochs,
                                 cfg.train.seed, info.rank, cfg.train.infobatch_prune)
    elif METHODS[method].allocation == "dynamic":
        from clusterft.dynamic import dynamic_source

        source = dynamic_source(cfg, mdir, np.asarray(sel["cluster"]), np.array([e.n_tokens for e in encoded]),
                                info.rank)
    live = LiveTraining(cfg, method, run or method, len(encoded)) if info.is_main and cfg.tracking.live else None
    history = train_on_plan(
        model, encoded, np.asarray(sel["weight"]), source, info.rank, tokenizer.pad_token_id,
        cfg.train.lr, cfg.train.warmup_ratio, cfg.train.weight_decay, cfg.train.log_every, info.device,
        checkpoint_dir=mdir / "checkpoint", checkpoint_every=cfg.train.checkpoint_every,
        world_size=info.world_size, on_step=live.on_step if live else None,
        optimizer_name=cfg.train.optimizer,
        precision=cfg.train.precision, grad_accum=cfg.train.grad_accum,
        micro_batch_tokens=cfg.train.micro_batch_tokens,
    )
    loop_s = time.perf_counter() - loop_start
    per_rank = gather_rank_timings(history, info.world_size)
    trained = plain_model(cfg, model, info)
    metrics: dict[str, Any] = {}
    if info.is_main:
        for h, timings in zip(history, per_rank):
            h.update(timings)
        save_trained(trained, tokenizer, mdir / "model")
        tail = history[-max(1, len(history) // 10):]
        metrics = {
            "method": method,
            "world_size": info.world_size,
            "backend": info.backend or "none",
            "strategy": cfg.train.strategy if info.world_size > 1 else "single",
            "steps": len(history),
            "samples_seen_rank0": sum(h["samples"] for h in history),
            "train_loop_s": loop_s,
            "final_loss": float(np.mean([h["weighted_loss"] for h in tail])),
            "tokens_per_s_rank0": float(np.sum([h["tokens"] for h in history])
                                        / max(1e-9, np.sum([h["compute_s"] for h in history]))),
            "peak_mem_mb_rank0": float(max((h["peak_mem_mb"] for h in history), default=0.0)),
            "truncation": truncation,
            **wait_summary(history),
            "samples_trained_per_epoch": getattr(source, "kept_per_epoch", None)
            or [int(x) for x in plan.step_sizes().sum(1)],
            "wall_clock_s": time.perf_counter() - start,
        }
        if live is not None:
            metrics["mlflow_run_id"] = live.finish(metrics, mdir / "model")
        atomic_write_text(mdir / "train_log.jsonl", "".join(json.dumps(h) + "\n" for h in history))
        shutil.rmtree(mdir / "checkpoint", ignore_errors=True)  # the run is complete
        write_json(mdir / "train_metrics.json", metrics)
    distributed.barrier()
    distributed.cleanup()
    return metrics
