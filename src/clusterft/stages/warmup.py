"""Warmup: the short training run the features are computed through.

`features.model: target`: a LoRA fine-tune of the model being trained on a random
`warmup.fraction` of train (what LESS and CluSTER do; costs a share of an epoch on a big
model). `proxy`: the built-in tiny model (own BPE tokenizer, `model.tiny` sizes) trained
from scratch on that fraction: seconds, whatever the target's size ("Compute-Constrained
Data Selection": a selector far smaller than the target is what pays off). An encoder
folder needs no warmup. With `features.kind: loss_traj` the run also keeps
`warmup.snapshots` evenly spaced snapshots (S2L's loss trajectories are taken on them).

Outputs, all under warmup/state/: adapter/ (target) or proxy/ (proxy), snapshots/.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterft.core.allocation import build_plan
from clusterft.core.tokens import Renderer, encode_all
from clusterft.io.artifacts import ensure_dir, write_json
from clusterft.io.moments import MOMENTS_FILE, save_adam_moments, state_dir
from clusterft.runtime.data import load_examples
from clusterft.runtime.loop import train_on_plan
from clusterft.runtime.model import (
    add_lora,
    base_model_dir,
    build_tiny_model,
    load_model,
    load_tokenizer,
    train_tokenizer,
)
from clusterft.spec.config import TrainConfig


def warmup_subset(n: int, fraction: float, seed: int) -> np.ndarray:
    """Sorted random rows, at least one."""
    m = max(1, int(round(fraction * n)))
    return np.sort(np.random.default_rng(seed).choice(n, size=m, replace=False))


def snapshot_steps(total: int, count: int) -> list[int]:
    """`count` evenly spaced optimizer steps in 1..total, the last one being `total`."""
    return sorted({max(1, int(round(total * (i + 1) / count))) for i in range(count)})


def _target_model(cfg: Any) -> tuple[Any, Any, Path]:
    """The model being trained + fresh LoRA, its tokenizer, and where the adapter goes."""
    base = base_model_dir(cfg)
    return (add_lora(load_model(base, cfg.model), cfg.lora), load_tokenizer(base, cfg.model),
            state_dir(cfg) / "adapter")


def _proxy_model(cfg: Any, texts: list[str]) -> tuple[Any, Any, Path]:
    """A from-scratch tiny model and a BPE tokenizer trained on `texts`."""
    tok = train_tokenizer(texts, cfg.model.tiny.vocab_size)
    return build_tiny_model(cfg.model.tiny, tok, cfg.data.max_length), tok, state_dir(cfg) / "proxy"


def warmup_examples(cfg: Any) -> list[Any]:
    """Train examples rendered as the warmed-up model will read them at the features stage:
    the target through `data`'s renderer (chat template included), the proxy as plain text."""
    plain = Renderer(cfg.data.prompt_template) if cfg.features.model == "proxy" else None
    return load_examples(cfg, "train", plain)


def run_warmup(cfg: Any) -> dict:
    """Stage `warmup`: writes warmup/state/ and warmup/metrics.json."""
    start = time.perf_counter()
    fm = cfg.features.model
    load_tokenizer(base_model_dir(cfg), cfg.model)  # a model that cannot train fails here, early
    out = state_dir(cfg)
    if out.exists():
        shutil.rmtree(out)  # a rerun never mixes old snapshots with new ones
    ensure_dir(out)
    if fm not in ("target", "proxy"):  # an encoder folder: nothing to train
        metrics = {"features_model": fm, "n_samples": 0, "steps": 0, "wall_clock_s": time.perf_counter() - start}
        write_json(cfg.artifact("warmup", "metrics.json"), metrics)
        return metrics
    rows, history, keep = _train(cfg, out)
    metrics = {
        "features_model": fm,
        "n_samples": int(len(rows)),
        "steps": len(history),
        "snapshots": sorted(keep),
        "first_loss": history[0]["loss"],
        "final_loss": history[-1]["loss"],
        "wall_clock_s": time.perf_counter() - start,
    }
    write_json(cfg.artifact("warmup", "metrics.json"), metrics)
    return metrics


def _train(cfg: Any, out: Path) -> tuple[np.ndarray, list[dict], set[int]]:
    """Train the warmup model on its random subset, keep its snapshots and save it (the
    target's adapter with its Adam moments, or the proxy with its tokenizer)."""
    w, fm = cfg.warmup, cfg.features.model
    examples = warmup_examples(cfg)
    rows = warmup_subset(len(examples), w.fraction, w.seed)
    torch.manual_seed(w.seed)
    if fm == "target":
        model, tokenizer, model_out = _target_model(cfg)
    else:
        model, tokenizer, model_out = _proxy_model(cfg, [f"{e.prompt} {e.response}" for e in examples])
    encoded = encode_all([examples[r] for r in rows], tokenizer, cfg.data.max_length)
    plan = build_plan(np.full(len(rows), -1), 1, w.batch_size, w.epochs, w.seed, mode="shuffle")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW([p for _, p in named], lr=w.lr)
    total = plan.epochs * plan.steps_per_epoch
    keep = set(snapshot_steps(total, w.snapshots)) if cfg.features.kind == "loss_traj" else set()

    def snapshot(g: int, rec: dict) -> None:
        if g in keep:
            model.save_pretrained(out / "snapshots" / f"step-{g:06d}", safe_serialization=True)

    settings = TrainConfig(lr=w.lr, log_every=max(1, plan.steps_per_epoch))  # one process, AdamW, fp32
    history = train_on_plan(model, encoded, np.ones(len(rows)), plan, settings, pad_id=tokenizer.pad_token_id,
                            optimizer=opt, on_step=snapshot)
    model.save_pretrained(model_out, safe_serialization=True)
    if fm == "target":
        save_adam_moments(opt, named, model_out / MOMENTS_FILE)
    else:
        tokenizer.save_pretrained(model_out)
    return rows, history, keep
