"""torch.distributed setup shared by training and feature extraction.

Under `torchrun` (RANK/WORLD_SIZE set) a process group is started: NCCL when CUDA is
available, gloo otherwise. Without torchrun everything runs as a world of one.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(timeout_s: int = 1800) -> DistInfo:
    """Join the torchrun process group if there is one; pick device and backend."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = None
    if world > 1:
        backend = "nccl" if cuda else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return DistInfo(rank, world, local, device, backend)


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def sum_over_ranks(values: list[int], device: torch.device) -> list[int]:
    """Element-wise sum over the torchrun world (also a barrier); identity for a world of one."""
    if not (dist.is_available() and dist.is_initialized()):
        return values
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t)
    return [int(v) for v in t.tolist()]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj` (picklable), in rank order; [obj] for a world of one."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def machine() -> dict[str, Any]:
    """What this process runs on (CPU model and cores, GPU, torch): runs made on different
    machines are not timed side by side, and the grid's report says so."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu, "torch": torch.__version__}
