"""MLflow tracking: one parent run per pipeline run, a nested run per method and per stage.

Stages write their metrics to JSON on disk (so DVC can track them and any stage can run
alone); this module reads those and records them, so tracking never changes results.
The store is a local sqlite file unless MLFLOW_TRACKING_URI says otherwise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from clusterft.config import flatten, to_dict


def tracking_uri(cfg: Any) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or cfg.tracking.tracking_uri


def _numeric(d: dict[str, Any]) -> dict[str, float]:
    """Flattened numeric leaves of a metrics dict (MLflow metrics must be numbers)."""
    out = {}
    for k, v in flatten(d).items():
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)) and v == v:  # drop NaN
            out[k.replace("/", "_")] = float(v)
    return out


SERIES_KEYS = ("loss", "weighted_loss", "lr", "step_s", "compute_s", "sync_s")


def _log_series(run_id: str, series: list[dict], batch: int = 900) -> None:
    """Per-step curves in batches (one call per step is slow on a sqlite store)."""
    import time

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    now = int(time.time() * 1000)
    points = [Metric(k, float(rec[k]), now, int(rec["step"])) for rec in series for k in SERIES_KEYS if k in rec]
    client = MlflowClient()
    for i in range(0, len(points), batch):
        client.log_batch(run_id, metrics=points[i : i + batch])


def _log_stage(mlflow: Any, name: str, metrics: dict[str, Any], series: list[dict] | None = None) -> None:
    with mlflow.start_run(run_name=name, nested=True) as run:
        mlflow.set_tag("clusterft.stage", name)
        mlflow.log_metrics(_numeric(metrics))
        mlflow.log_dict(metrics, f"{name}.json")
        if series:
            _log_series(run.info.run_id, series)


def log_pipeline(cfg: Any, collected: dict[str, Any], rows: list[dict[str, Any]],
                 artifacts: list[Path]) -> str:
    """Record a finished pipeline run; return the parent run id."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri(cfg))
    mlflow.set_experiment(cfg.tracking.experiment)
    with mlflow.start_run(run_name="pipeline") as parent:
        mlflow.set_tag("clusterft.kind", "pipeline")
        mlflow.log_params({k: str(v)[:500] for k, v in flatten(to_dict(cfg)).items()})
        for stage, metrics in collected["shared"].items():
            _log_stage(mlflow, stage, metrics)
        for row in rows:
            method = row["method"]
            with mlflow.start_run(run_name=method, nested=True):
                mlflow.set_tag("clusterft.method", method)
                mlflow.log_metrics(_numeric({k: v for k, v in row.items() if k != "method"}))
                mdir = cfg.artifact("methods", method)
                if (mdir / "plots").is_dir():
                    mlflow.log_artifacts(str(mdir / "plots"), artifact_path="plots")
                for stage, metrics in collected["methods"].get(method, {}).items():
                    series = None
                    if stage == "train" and (mdir / "train_log.jsonl").exists():
                        series = [json.loads(x) for x in (mdir / "train_log.jsonl").read_text().splitlines()]
                    _log_stage(mlflow, f"{method}/{stage}", metrics, series)
            mlflow.log_metrics({f"{method}.{k}": v for k, v in _numeric(row).items()})
        for a in artifacts:
            mlflow.log_artifact(str(a))
        return parent.info.run_id
