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


def save_adam_moments(opt: Any, named: list, path: Any) -> None:
    """AdamW first/second moments per LoRA parameter (for LESS-style preconditioning).

    Keys: '<param name>.exp_avg' and '<param name>.exp_avg_sq'; metadata holds betas, eps
    and the step count."""
    from safetensors.torch import save_file

    tensors, step = {}, 0
    for name, p in named:
        st = opt.state.get(p, {})
        if "exp_avg" in st:
            tensors[f"{name}.exp_avg"] = st["exp_avg"].detach().contiguous()
            tensors[f"{name}.exp_avg_sq"] = st["exp_avg_sq"].detach().contiguous()
            step = int(st["step"])
    b1, b2 = opt.param_groups[0]["betas"]
    meta = {"beta1": str(b1), "beta2": str(b2), "eps": str(opt.param_groups[0]["eps"]), "step": str(step)}
    save_file(tensors, str(path), metadata=meta)


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
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW([p for _, p in named], lr=w.lr)
    history = train_on_plan(model, encoded, np.ones(len(rows)), plan, 0, tokenizer.pad_token_id,
                            w.lr, log_every=max(1, plan.steps_per_epoch), optimizer=opt)
    out = cfg.artifact("warmup")
    model.save_pretrained(out / "adapter", safe_serialization=True)
    save_adam_moments(opt, named, out / "adapter" / "adam_moments.safetensors")
    metrics = {
        "n_samples": int(len(rows)),
        "steps": len(history),
        "first_loss": history[0]["loss"],
        "final_loss": history[-1]["loss"],
        "wall_clock_s": time.perf_counter() - start,
    }
    write_json(out / "metrics.json", metrics)
    return metrics
