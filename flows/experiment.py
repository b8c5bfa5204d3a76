"""Prefect comparison flow: the experiment grid (methods x budgets x seeds) as tasks, one
per run (training retried), then the report. Same functions as `clusterft experiment`."""

from __future__ import annotations

import sys

from prefect import flow, task

from clusterft.config import load_config
from clusterft.experiment import RunSpec, grid, prepare_shared, run_one, write_report


@task(name="run", retries=1, retry_delay_seconds=5)
def run_task(params: str, overrides: list[str], spec: RunSpec) -> dict:
    return run_one(params, overrides, spec)


@flow(name="clusterft-experiment", log_prints=True)
def experiment(params: str = "params.yaml", overrides: list[str] | None = None) -> dict:
    overrides = list(overrides or [])
    cfg = load_config(params, overrides)
    e = cfg.experiment
    prepare_shared(cfg)
    rows = [run_task.with_options(name=s.name)(params, overrides, s)
            for s in grid(e.methods, e.budgets, e.seeds)]
    return write_report(cfg, rows)


if __name__ == "__main__":
    experiment(sys.argv[1] if len(sys.argv) > 1 else "params.yaml", sys.argv[2:])
