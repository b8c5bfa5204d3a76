"""Training checkpoints: trainable weights (safetensors; under FSDP every rank's shard of the
weights and optimizer state through torch.distributed.checkpoint), optimizer, scheduler, loss
scaler, RNG and plan position, swapped in atomically, resumed only by the run (plan, weights,
hyper-parameters) that wrote them."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterft.core.allocation import AllocationPlan
from clusterft.errors import OutputError
from clusterft.io.artifacts import ensure_dir

log = logging.getLogger(__name__)


CHECKPOINT_FILES = ("trainable.safetensors", "optimizer.pt", "meta.json")
SHARDED_FILES = ("shards/.metadata", "optimizer.pt", "meta.json")


def _sharded_state(model: Any, opt: Any) -> dict:
    """This rank's shard of the trainable weights and optimizer state (DTensors)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, opt, options=StateDictOptions(ignore_frozen_params=True))
    return {"model": msd, "optim": osd}


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def _all_ranks(ok: bool, sharded: bool) -> bool:
    """Whether every rank succeeded (under FSDP each rank reads or writes its own shard; a
    single process answers for itself). The flag lives where the backend can reduce it."""
    if not sharded:
        return ok
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def run_digest(plan: AllocationPlan, weights: np.ndarray, *hyper: Any) -> str:
    """Identity of a training run (plan, weights, hyper-parameters): a checkpoint is only
    resumed by the run that wrote it."""
    import hashlib

    h = hashlib.sha1(plan.table.tobytes())
    h.update(np.asarray(weights, dtype=np.float64).tobytes())
    h.update(repr(hyper).encode())
    return h.hexdigest()


def save_checkpoint(ckpt_dir: Path, model: Any, opt: Any, sched: Any, source: Any,
                    position: tuple[int, int], digest: str, history: list[dict], scaler: Any = None,
                    sharded: bool = False, rank: int = 0) -> None:
    """Trainable weights, optimizer/scheduler/RNG state and plan position, written to a temp
    folder and swapped in, so a crash never leaves half a checkpoint. A write that fails (a
    full disk) leaves the previous checkpoint in place. Sharded (FSDP): every rank calls
    this and writes its own shard; rank 0 writes the rest and swaps the folder in once
    every rank has succeeded."""
    import shutil

    from safetensors.torch import save_file

    tmp = ckpt_dir.with_name(ckpt_dir.name + ".tmp")
    old = ckpt_dir.with_name(ckpt_dir.name + ".old")
    error: Exception | None = None
    try:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            ensure_dir(tmp)
        if sharded:
            import torch.distributed.checkpoint as dcp

            _barrier()
            dcp.save(_sharded_state(model, opt), checkpoint_id=str(tmp / "shards"))
        else:
            save_file({n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad},
                      str(tmp / "trainable.safetensors"))
        if rank == 0:
            torch.save({"optimizer": {} if sharded else opt.state_dict(), "scheduler": sched.state_dict(),
                        "rng": torch.get_rng_state(), "scaler": scaler.state_dict() if scaler else {}},
                       tmp / "optimizer.pt")
            (tmp / "meta.json").write_text(json.dumps({"next_step": len(history), "position": list(position),
                                                       "plan": digest, "source": source.state_dict(),
                                                       "history": history}))
    except Exception as exc:  # OSError, or safetensors' own error type for the same failure
        error = exc
    if not _all_ranks(error is None, sharded):
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        why = error or "another rank could not write its shard"
        raise OutputError(f"{tmp}: cannot write the checkpoint ({why}); the previous checkpoint "
                          f"{ckpt_dir} is unchanged") from error
    if rank == 0:
        if ckpt_dir.exists():
            shutil.rmtree(old, ignore_errors=True)
            ckpt_dir.rename(old)
        tmp.rename(ckpt_dir)
        shutil.rmtree(old, ignore_errors=True)
    if sharded:
        _barrier()


def _read_meta(d: Path, digest: str) -> tuple[dict, dict]:
    """(meta, scheduler/RNG/optimizer state) of checkpoint `d`, checked against the run."""
    meta = json.loads((d / "meta.json").read_text())
    if meta["plan"] != digest:
        raise ValueError("it was written for another plan, weights or hyper-parameters")
    return meta, torch.load(d / "optimizer.pt", weights_only=True)


def _read_weights(d: Path, model: Any, opt: Any, sharded: bool) -> dict:
    """The trainable weights of checkpoint `d` (sharded: this rank's shard of weights and
    optimizer state), read into fresh tensors and checked, so a bad checkpoint changes nothing."""
    if sharded:
        import torch.distributed.checkpoint as dcp
        from torch.utils._pytree import tree_map_only

        state = tree_map_only(torch.Tensor, torch.empty_like, _sharded_state(model, opt))
        dcp.load(state, checkpoint_id=str(d / "shards"))
        return state
    from safetensors.torch import load_file

    state = load_file(str(d / "trainable.safetensors"))
    for n, p in model.named_parameters():
        if p.requires_grad and (n not in state or state[n].shape != p.shape):
            raise ValueError(f"trainable tensor {n} is missing or has another shape")
    return state


def _attempt(d: Path, read: Any, sharded: bool) -> tuple[bool, Any]:
    """One read of checkpoint `d`: (every rank succeeded, this rank's result)."""
    try:
        result, ok = read(), True
    except Exception as exc:  # truncated, corrupt or foreign: not this run's state
        log.warning("%s: checkpoint not used (%s)", d, exc)
        result, ok = None, False
    return _all_ranks(ok, sharded), result


def load_checkpoint(ckpt_dir: Path, model: Any, opt: Any, sched: Any, source: Any,
                    digest: str, scaler: Any = None, sharded: bool = False) -> tuple[tuple[int, int], list[dict]]:
    """Restore the newest readable checkpoint written for the same run: ((epoch, step) to
    resume at, history so far), or ((0, 0), []) when there is none. A corrupt or foreign
    checkpoint is skipped with a warning (the previous one, else a fresh start); every file
    is read and checked before anything is restored, so a bad one changes nothing. Under
    FSDP the ranks take each decision together (reading a shard is a collective)."""
    files = SHARDED_FILES if sharded else CHECKPOINT_FILES
    touched = False
    for d in (ckpt_dir, ckpt_dir.with_name(ckpt_dir.name + ".old")):
        if not _all_ranks(all((d / f).exists() for f in files), sharded):
            continue
        ok, got = _attempt(d, lambda: _read_meta(d, digest), sharded)
        if not ok:
            continue
        meta, rest = got
        touched = True
        ok, state = _attempt(d, lambda: _read_weights(d, model, opt, sharded), sharded)
        if not ok:
            continue
        if sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"],
                           options=StateDictOptions(ignore_frozen_params=True, strict=False))
        else:
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if p.requires_grad:
                        p.copy_(state[n])
            opt.load_state_dict(rest["optimizer"])
        sched.load_state_dict(rest["scheduler"])
        torch.set_rng_state(rest["rng"])
        if scaler is not None and rest.get("scaler"):
            scaler.load_state_dict(rest["scaler"])
        source.load_state_dict(meta["source"])
        log.info("resumed from %s at step %d", d, meta["next_step"])
        return tuple(meta["position"]), meta["history"]
    if sharded and touched:
        opt.state.clear()  # reading a shard initialised the optimizer state: start truly fresh
    if any(d.exists() for d in (ckpt_dir, ckpt_dir.with_name(ckpt_dir.name + ".old"))):
        log.warning("%s: no usable checkpoint; training starts from step 0", ckpt_dir)
    return (0, 0), []
