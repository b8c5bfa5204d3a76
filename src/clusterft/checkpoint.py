"""Training checkpoints: trainable weights (safetensors), optimizer, scheduler, RNG and plan
position, swapped in atomically, resumed only by the run (plan, weights, hyper-parameters)
that wrote them."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterft.allocation import AllocationPlan

log = logging.getLogger(__name__)


CHECKPOINT_FILES = ("trainable.safetensors", "optimizer.pt", "meta.json")


def run_digest(plan: AllocationPlan, weights: np.ndarray, *hyper: float) -> str:
    """Identity of a training run (plan, weights, hyper-parameters): a checkpoint is only
    resumed by the run that wrote it."""
    import hashlib

    h = hashlib.sha1(plan.table.tobytes())
    h.update(np.asarray(weights, dtype=np.float64).tobytes())
    h.update(repr(hyper).encode())
    return h.hexdigest()


def save_checkpoint(ckpt_dir: Path, model: Any, opt: Any, sched: Any, source: Any,
                    position: tuple[int, int], digest: str, history: list[dict]) -> None:
    """Trainable weights (safetensors), optimizer/scheduler/RNG state and plan position,
    written to a temp folder and swapped in, so a crash never leaves half a checkpoint."""
    import shutil

    from safetensors.torch import save_file

    from clusterft.artifacts import ensure_dir

    tmp = ckpt_dir.with_name(ckpt_dir.name + ".tmp")
    old = ckpt_dir.with_name(ckpt_dir.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    ensure_dir(tmp)
    save_file({n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad},
              str(tmp / "trainable.safetensors"))
    torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "rng": torch.get_rng_state()}, tmp / "optimizer.pt")
    (tmp / "meta.json").write_text(json.dumps({"next_step": len(history), "position": list(position),
                                               "plan": digest, "source": source.state_dict(),
                                               "history": history}))
    if ckpt_dir.exists():
        shutil.rmtree(old, ignore_errors=True)
        ckpt_dir.rename(old)
    tmp.rename(ckpt_dir)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(ckpt_dir: Path, model: Any, opt: Any, sched: Any, source: Any,
                    digest: str) -> tuple[tuple[int, int], list[dict]]:
    """Restore a checkpoint written for the same run: ((epoch, step) to resume at, history
    so far), or ((0, 0), []) when there is none."""
    from safetensors.torch import load_file

    for d in (ckpt_dir, ckpt_dir.with_name(ckpt_dir.name + ".old")):
        if all((d / f).exists() for f in CHECKPOINT_FILES):
            break
    else:
        return (0, 0), []
    meta = json.loads((d / "meta.json").read_text())
    if meta["plan"] != digest:
        log.warning("%s: checkpoint is for another plan; starting from scratch", d)
        return (0, 0), []
    state = load_file(str(d / "trainable.safetensors"))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(state[n])
    rest = torch.load(d / "optimizer.pt", weights_only=True)
    opt.load_state_dict(rest["optimizer"])
    sched.load_state_dict(rest["scheduler"])
    torch.set_rng_state(rest["rng"])
    source.load_state_dict(meta["source"])
    log.info("resumed from %s at step %d", d, meta["next_step"])
    return tuple(meta["position"]), meta["history"]
