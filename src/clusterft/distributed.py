"""torch.distributed setup shared by training and feature extraction.

Under `torchrun` (RANK/WORLD_SIZE set) a process group is started: NCCL when CUDA is
available, gloo otherwise. Without torchrun everything runs as a world of one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


class LaunchError(RuntimeError):
    """The torchrun workers failed; they printed their own error (exit code 1, not 2: a lost
    worker is not bad input)."""


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


def torchrun_command(nproc: int, module_args: list[str], nnodes: int = 1,
                     extra: list[str] | None = None) -> list[str]:
    """`python -m torch.distributed.run ... -m clusterft.cli <args>` for one node."""
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    if nnodes == 1:
        launcher.append("--standalone")
    return launcher + list(extra or []) + ["-m", "clusterft.cli", *module_args]


def stage_argv(name: str, params: str, overrides: list[str], method: str | None = None,
               run: str | None = None) -> list[str]:
    """`clusterft` arguments that rerun one stage with the same params file and overrides."""
    argv = [name, "--params", str(params), *[a for o in overrides for a in ("--set", o)]]
    if method:
        argv += ["--method", method]
    if run:
        argv += ["--run-name", run]
    return argv


def launch_stage(cfg: Any, name: str, params: str, overrides: list[str], method: str | None = None,
                 run: str | None = None) -> None:
    """Run a stage under torchrun with the worker count and restarts its STAGES entry names,
    after its preflight check (a bad input fails here, once, not on every rank and restart)."""
    from clusterft.stages import stage

    st = stage(name)
    if st.check is not None:
        st.check(cfg, method, run) if st.per_method else st.check(cfg)
    launch(st.nproc(cfg), stage_argv(name, params, overrides, method, run),
           max_restarts=cfg.value(st.restarts) if st.restarts else 0)


def launch(nproc: int, module_args: list[str], env: dict | None = None, max_restarts: int = 0) -> None:
    """Run a clusterft subcommand under torchrun and wait; raise on failure. After a worker
    dies, torchrun restarts all workers up to `max_restarts` times (they resume)."""
    cmd = torchrun_command(nproc, module_args, extra=[f"--max-restarts={max_restarts}"])
    run_env = {**os.environ, **(env or {})}
    res = subprocess.run(cmd, env=run_env)
    if res.returncode != 0:
        raise LaunchError(f"torchrun exited with code {res.returncode} (the workers' own error is "
                          f"above): {' '.join(cmd)}")
