"""Weighted data-parallel fine-tuning that follows an allocation plan (torchrun + DDP).

Each step, rank r trains the plan's samples for (epoch, step, r). Its loss is
(world / B_step) * sum_i w_i * l_i, with l_i the mean response-token loss of sample i and
B_step the number of samples in the whole global step, so DDP's gradient average equals
the weighted mean over the global step even when ranks hold different sample counts.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterft.allocation import AllocationPlan
from clusterft.data import Encoded, collate, per_sample_loss

log = logging.getLogger(__name__)


def weighted_loss(model: Any, batch: dict[str, torch.Tensor], weights: torch.Tensor,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale * sum_i w_i l_i, per-sample losses l [B])."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    losses = per_sample_loss(out.logits, batch["labels"])
    return scale * (weights * losses).sum(), losses.detach()


def cosine_schedule(optimizer: torch.optim.Optimizer, total_steps: int, warmup_ratio: float):
    """Linear warmup then cosine decay to 10% of the peak learning rate."""
    warm = max(1, int(round(warmup_ratio * total_steps)))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, total_steps - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def train_on_plan(
    model: Any,
    encoded: list[Encoded],
    weights: np.ndarray,
    plan: AllocationPlan,
    rank: int,
    pad_id: int,
    lr: float,
    warmup_ratio: float = 0.05,
    weight_decay: float = 0.0,
    log_every: int = 20,
    device: torch.device | None = None,
) -> list[dict]:
    """Run the plan for this rank; return rank-local step records (loss, times)."""
    device = device or torch.device("cpu")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    total = plan.epochs * plan.steps_per_epoch
    sched = cosine_schedule(opt, total, warmup_ratio)
    step_sizes = plan.step_sizes()
    w_all = torch.tensor(weights, dtype=torch.float32)
    history: list[dict] = []
    model.train()
    t0 = time.perf_counter()
    for g, (epoch, step, idx) in enumerate(plan.rank_batches(rank)):
        ts = time.perf_counter()
        batch = {k: v.to(device) for k, v in collate([encoded[i] for i in idx], pad_id).items()}
        scale = plan.world_size / float(step_sizes[epoch, step])
        loss, losses = weighted_loss(model, batch, w_all[idx].to(device), scale)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        rec = {
            "step": g, "epoch": epoch, "loss": float(losses.mean()),
            "weighted_loss": loss.item() / scale / max(1, len(idx)),
            "lr": sched.get_last_lr()[0], "samples": int(len(idx)),
            "tokens": int(batch["attention_mask"].sum()), "step_s": time.perf_counter() - ts,
        }
        history.append(rec)
        if rank == 0 and (g % log_every == 0 or g == total - 1):
            el = time.perf_counter() - t0
            log.info("epoch %d step %d/%d loss %.4f lr %.2e %.0f ms/step", epoch, g + 1, total,
                     rec["loss"], rec["lr"], 1000 * el / (g + 1))
    return history


def _build_model(cfg: Any, info: Any) -> tuple[Any, Any]:
    from clusterft.model import add_lora, base_model_dir, load_model, load_tokenizer

    base = base_model_dir(cfg)
    tokenizer = load_tokenizer(base, cfg.model)
    torch.manual_seed(cfg.train.seed)
    model = load_model(base, cfg.model)
    if cfg.train.finetune == "lora":
        model = add_lora(model, cfg.lora)
    return model.to(info.device), tokenizer


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


def run_train(cfg: Any, method: str) -> dict:
    """Stage `train`: follows methods/<m>/plan.npy; writes model/, train_metrics.json."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from clusterft import distributed
    from clusterft.allocation import load_plan
    from clusterft.artifacts import atomic_write_text, write_json
    from clusterft.data import encode_all, load_examples
    from clusterft.selection import read_selection

    start = time.perf_counter()
    info = distributed.init_distributed()
    mdir = cfg.artifact("methods", method)
    plan = load_plan(mdir)
    if plan.world_size != info.world_size:
        raise RuntimeError(
            f"{mdir / 'plan.npy'}: plan is for {plan.world_size} workers but torchrun started "
            f"{info.world_size}; rerun `clusterft allocate` with train.nproc={info.world_size}"
        )
    sel = read_selection(mdir / "selection.jsonl")
    examples = load_examples(cfg, "train")
    model, tokenizer = _build_model(cfg, info)
    encoded = encode_all([examples[r] for r in sel["row"]], tokenizer, cfg.data.max_length)
    if info.world_size > 1:
        model = DDP(model, device_ids=[info.local_rank] if info.device.type == "cuda" else None)
    loop_start = time.perf_counter()
    history = train_on_plan(
        model, encoded, np.asarray(sel["weight"]), plan, info.rank, tokenizer.pad_token_id,
        cfg.train.lr, cfg.train.warmup_ratio, cfg.train.weight_decay, cfg.train.log_every, info.device,
    )
    loop_s = time.perf_counter() - loop_start
    metrics: dict[str, Any] = {}
    if info.is_main:
        inner = model.module if info.world_size > 1 else model
        save_trained(inner, tokenizer, mdir / "model")
        tail = history[-max(1, len(history) // 10):]
        metrics = {
            "method": method,
            "world_size": info.world_size,
            "backend": info.backend or "none",
            "steps": len(history),
            "samples_seen_rank0": sum(h["samples"] for h in history),
            "train_loop_s": loop_s,
            "final_loss": float(np.mean([h["loss"] for h in tail])),
            "wall_clock_s": time.perf_counter() - start,
        }
        atomic_write_text(mdir / "train_log.jsonl", "".join(json.dumps(h) + "\n" for h in history))
        write_json(mdir / "train_metrics.json", metrics)
    distributed.barrier()
    distributed.cleanup()
    return metrics
