"""Prefect flow: the same stages as dvc.yaml, as Prefect tasks (retries on training).

Each task calls the stage's library function (training goes through torchrun), so the
flow holds order and retries only. Run once: `python flows/pipeline.py [params.yaml]`.
"""

from __future__ import annotations

import sys
from typing import Any

from prefect import flow, task

from clusterft.config import load_config
from clusterft.distributed import launch
from clusterft.stages import stage_functions

SHARED = ("make-benchmark", "prepare-model", "warmup", "features", "cluster")
CLUSTERED = ("cluster", "cluster_paper")  # methods that need warmup/features/cluster


@task(name="stage")
def run_stage(name: str, params: str, overrides: list[str], method: str | None = None) -> dict:
    cfg = load_config(params, overrides)
    fn = stage_functions()[name]
    return fn(cfg, method) if method else fn(cfg)


@task(name="train", retries=2, retry_delay_seconds=5)
def run_training(params: str, overrides: list[str], method: str) -> None:
    cfg = load_config(params, overrides)
    sets = [a for o in overrides for a in ("--set", o)]
    launch(cfg.train.nproc, ["train", "--params", params, "--method", method, *sets],
           max_restarts=cfg.train.max_restarts)


@flow(name="clusterft-pipeline", log_prints=True)
def pipeline(params: str = "params.yaml", overrides: list[str] | None = None) -> dict[str, Any]:
    """Benchmark/model, warmup -> features -> cluster, then select/allocate/train/evaluate
    per method, then the comparison report (and its MLflow runs)."""
    overrides = list(overrides or [])
    cfg = load_config(params, overrides)
    methods = list(cfg.select.methods)
    shared = SHARED if any(m in CLUSTERED for m in methods) else SHARED[:2]
    for name in shared:
        if name == "make-benchmark" and cfg.data.source != "builtin":
            continue
        run_stage.with_options(name=name)(name, params, overrides)
    for m in methods:
        run_stage.with_options(name=f"select[{m}]")("select", params, overrides, m)
        run_stage.with_options(name=f"allocate[{m}]")("allocate", params, overrides, m)
        run_training.with_options(name=f"train[{m}]")(params, overrides, m)
        run_stage.with_options(name=f"evaluate[{m}]")("evaluate", params, overrides, m)
    return run_stage.with_options(name="compare")("compare", params, overrides)


if __name__ == "__main__":
    pipeline(sys.argv[1] if len(sys.argv) > 1 else "params.yaml", sys.argv[2:])
