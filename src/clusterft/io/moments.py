"""The warmup's state as the features stage reads it: the folder (warmup/state) and the
AdamW moments of its LoRA weights (LESS-style preconditioning), in safetensors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from clusterft.core.lora_grads import AdamMoments
from clusterft.errors import LoraGradError
from clusterft.spec.stages import stage

MOMENTS_FILE = "adam_moments.safetensors"


def state_dir(cfg: Any) -> Path:
    """warmup/state: everything the features stage reads (one DVC output)."""
    return stage("warmup").path(cfg, stage("warmup").outs[0])


def save_adam_moments(opt: Any, named: list, path: str | Path) -> None:
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


def load_adam_moments(path: str | Path, names: list[str]) -> AdamMoments:
    """Moments saved by the warmup ('<name>.exp_avg', '<name>.exp_avg_sq'), in `names` order."""
    from safetensors import safe_open

    p = Path(path)
    if not p.exists():
        raise LoraGradError(f"{p}: no Adam moments (rerun warmup, or set features.precondition: false)")
    with safe_open(str(p), framework="pt") as fh:
        keys, meta = set(fh.keys()), fh.metadata() or {}
        absent = [n for n in names if f"{n}.exp_avg" not in keys or f"{n}.exp_avg_sq" not in keys]
        if absent:
            raise LoraGradError(f"{p}: no moments for {absent[:3]} (adapter and moments disagree)")
        m = torch.cat([fh.get_tensor(f"{n}.exp_avg").float().flatten() for n in names])
        v = torch.cat([fh.get_tensor(f"{n}.exp_avg_sq").float().flatten() for n in names])
    try:
        return AdamMoments(m, v, float(meta["beta1"]), float(meta["beta2"]), float(meta["eps"]))
    except KeyError as exc:
        raise LoraGradError(f"{p}: metadata lacks {exc} (expected beta1, beta2, eps)") from exc
