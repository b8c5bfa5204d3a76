"""The one way a stage is run, whichever entry point asks (the CLI, `dvc repro` through the
CLI, Prefect through `dvc repro`, the experiment grid, the tests): in this process when the
stage table gives it one worker, else relaunched under torchrun with the table's worker
count and restarts, after its preflight check (a bad input fails once, not on every rank).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from typing import Any, Callable

from clusterft.errors import LaunchError
from clusterft.spec.stages import STAGES, Stage, stage


def resolve(ref: str) -> Callable[..., Any]:
    """"module:function" under clusterft (imported on use, so `clusterft --help` stays fast)."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(f"clusterft.{module}"), name)


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


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


def launch(nproc: int, module_args: list[str], env: dict | None = None, max_restarts: int = 0) -> None:
    """Run a clusterft subcommand under torchrun and wait; raise on failure. After a worker
    dies, torchrun restarts all workers up to `max_restarts` times (they resume)."""
    cmd = torchrun_command(nproc, module_args, extra=[f"--max-restarts={max_restarts}"])
    res = subprocess.run(cmd, env={**os.environ, **(env or {})})
    if res.returncode != 0:
        raise LaunchError(f"torchrun exited with code {res.returncode} (the workers' own error is "
                          f"above): {' '.join(cmd)}")


def _call(st: Stage, ref: str, cfg: Any, method: str | None, run: str | None) -> Any:
    fn = resolve(ref)
    return fn(cfg, method, run) if st.per_method else fn(cfg)


def run_stage(cfg: Any, name: str, params: str, overrides: list[str], method: str | None = None,
              run: str | None = None) -> Any:
    """Run stage `name` for `cfg` (loaded from `params` + `overrides`, which a torchrun
    relaunch passes on); its return value when it ran in this process, else None."""
    st = stage(name)
    if st.nproc(cfg) == 1 or under_torchrun():
        return _call(st, st.func, cfg, method, run)
    if st.preflight:
        _call(st, st.preflight, cfg, method, run)
    launch(st.nproc(cfg), stage_argv(name, params, overrides, method, run),
           max_restarts=cfg.value(st.restarts) if st.restarts else 0)
    return None


def stage_functions() -> dict[str, Callable[..., Any]]:
    """name -> stage function, called in this process whatever its worker count (tests and
    benchmarks that time one stage alone)."""
    return {s.name: resolve(s.func) for s in STAGES}
