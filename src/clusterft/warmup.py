"""Warmup: a short LoRA fine-tune on a small random fraction of train.

The adapter it leaves behind is what gradient features are computed through, so samples
are compared by how a slightly trained model would learn from them.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from clusterft.allocation import build_plan
from clusterft.train import train_on_plan


def warmup_subset(n: int, fraction: float, seed: int) -> np.ndarray:
    """Sorted random rows, at least one."""
    m = max(1, int(round(fraction * n)))
    return np.sort(np.random.default_rng(seed).choice(n, size=m, replace=False))


def run_warmup(cfg: Any) -> dict:
    """Stage `warmup`: writes warmup/adapter/ (peft, safetensors) and warmup/metrics.json."""
    import torch

    from clusterft.artifacts import write_json
    from clusterft.data import encode_all, load_examples
    from clusterft.model import add_lora, base_model_dir, load_model, load_tokenizer

    start = time.perf_counter()
    w = cfg.warmup
    base = base_model_dir(cfg)
    tokenizer = load_tokenizer(base, cfg.model)
    examples = load_examples(cfg, "train")
    rows = warmup_subset(len(examples), w.fraction, w.seed)
    encoded = encode_all([examples[r] for r in rows], tokenizer, cfg.data.max_length)
    torch.manual_seed(w.seed)
    model = add_lora(load_model(base, cfg.model), cfg.lora)
    plan = build_plan(np.full(len(rows), -1), 1, w.batch_size, w.epochs, w.seed, mode="shuffle")
    history = train_on_plan(model, encoded, np.ones(len(rows)), plan, 0, tokenizer.pad_token_id,
                            w.lr, log_every=max(1, plan.steps_per_epoch))
    out = cfg.artifact("warmup")
    model.save_pretrained(out / "adapter", safe_serialization=True)
    metrics = {
        "n_samples": int(len(rows)),
        "steps": len(history),
        "first_loss": history[0]["loss"],
        "final_loss": history[-1]["loss"],
        "wall_clock_s": time.perf_counter() - start,
    }
    write_json(out / "metrics.json", metrics)
    return metrics
