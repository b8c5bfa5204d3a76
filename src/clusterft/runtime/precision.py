"""Numeric precision of the forwards (`train.precision`) and the memory a rank has used."""

from __future__ import annotations

import resource
from contextlib import nullcontext
from typing import Any

import torch

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision: str, device: torch.device) -> Any:
    """Mixed-precision context for forward passes: fp32 weights stay the master copy (AdamW
    updates them); bf16 / fp16 run the matmuls in half precision where the device supports it."""
    dtype = PRECISIONS[precision]
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this rank so far: allocated CUDA memory on a GPU, the process's peak
    resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
