"""How a model is spread over the data-parallel ranks (`train.strategy`): DDP keeps a full
replica per rank and all-reduces gradient buckets while the backward still runs; FSDP2
(`fully_shard`) shards weights, gradients and optimizer state and reduce-scatters gradients
layer by layer. Both average gradients over ranks, so the weighted loss is unchanged.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

import torch

from clusterft.runtime.precision import PRECISIONS


class SyncClock:
    """DDP communication hook that notes when this rank's last gradient bucket became ready.
    The backward's time after that moment is exposed sync: communication the backward did
    not hide plus waiting for the slowest rank (the straggler figure)."""

    def __init__(self) -> None:
        self.last: float | None = None

    def hook(self, bucket):  # no annotations: DDP checks them against its own types
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        self.last = time.perf_counter()
        return allreduce_hook(None, bucket)


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated layers HF names in `_no_split_modules` (decoder blocks): FSDP's units."""
    names = {n for m in model.modules() for n in (getattr(m, "_no_split_modules", None) or [])}
    return [m for m in model.modules() if type(m).__name__ in names]


def wrap(model: torch.nn.Module, strategy: str, info: Any, precision: str = "fp32") -> torch.nn.Module:
    """The model as this rank trains it: unchanged in a world of one, else DDP (with a
    SyncClock) or FSDP2 (each decoder block, then the root; bf16 / fp16 weights in the
    forward and fp32 gradient reduction when `precision` asks for half precision)."""
    if info.world_size == 1:
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=PRECISIONS[precision], reduce_dtype=torch.float32)
        for block in _blocks(model):
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, device_ids=[info.local_rank] if info.device.type == "cuda" else None)
    ddp.sync_clock = SyncClock()
    ddp.register_comm_hook(ddp.sync_clock, SyncClock.hook)
    return ddp


def is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def unwrap(model: Any) -> Any:
    """The user's module inside a DDP wrapper (FSDP2 shards in place: nothing to unwrap)."""
    return getattr(model, "module", model) if hasattr(model, "sync_clock") else model


def gradient_sync(model: Any, sync: bool) -> Any:
    """Context for one micro-batch's backward: gradients are reduced across ranks only on a
    step's last micro-batch (`sync`); earlier ones accumulate locally."""
    if is_sharded(model):
        model.set_requires_gradient_sync(sync)
        return nullcontext()
    if hasattr(model, "sync_clock") and not sync:
        return model.no_sync()
    return nullcontext()


def last_bucket_time(model: Any, reset: bool = False) -> float | None:
    """When the last gradient bucket of the current step was ready (DDP only), or None."""
    clock = getattr(model, "sync_clock", None)
    if clock is None:
        return None
    t = clock.last
    if reset:
        clock.last = None
    return t


def full_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Every weight, unsharded, on rank 0 (a collective under FSDP: every rank calls it;
    the other ranks get {}); the plain state dict otherwise."""
    if not is_sharded(model):
        return unwrap(model).state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def grad_scaler(precision: str, device: torch.device, model: Any) -> Any:
    """Loss scaler for fp16 (None otherwise). Under FSDP each rank holds a shard of the
    gradients, so the overflow check is all-reduced: every rank takes the same skip decision."""
    if precision != "fp16":
        return None
    if is_sharded(model):
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    return torch.amp.GradScaler(device.type)
