"""MLflow tracking: one parent run per pipeline run, a nested run per method and per stage,
and each training run logged live by rank 0 (params, dataset, per-step curve, model).

Stages write their metrics to JSON on disk (so DVC can track them and any stage can run
alone); `compare` reads those and records them. Tracking never changes results: a store
that fails is logged as a warning and training goes on. Every run carries the same
flattened params, the git commit and the dvc.lock digest. The store is a local sqlite
file unless MLFLOW_TRACKING_URI says otherwise.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

from clusterft.io.artifacts import file_digest
from clusterft.spec.config import flatten, to_dict

log = logging.getLogger(__name__)
EXPERIMENT_KIND = "custom_model_development"  # the MLflow UI opens on runs and training curves


# the user's MLFLOW_TRACKING_URI, read before mlflow.set_tracking_uri (which writes that
# variable) could make one config's store override the next one's in the same process
_USER_URI = os.environ.get("MLFLOW_TRACKING_URI")


def tracking_uri(cfg: Any) -> str:
    return _USER_URI or cfg.tracking.tracking_uri


def use_experiment(cfg: Any) -> str:
    """Point MLflow at the store and experiment (created as a model-training experiment)."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri(cfg))
    if _USER_URI is None:  # set_tracking_uri exported it: workers and later configs read their own
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    exp = mlflow.set_experiment(cfg.tracking.experiment)
    if exp.tags.get("mlflow.experimentKind") != EXPERIMENT_KIND:
        mlflow.MlflowClient().set_experiment_tag(exp.experiment_id, "mlflow.experimentKind", EXPERIMENT_KIND)
    return exp.experiment_id


def run_params(cfg: Any) -> dict[str, str]:
    """Every effective param, flattened (`select.budget`): the same keys in every run."""
    return {k: str(v)[:500] for k, v in flatten(to_dict(cfg)).items()}


def _digest(path: Path) -> str:
    return file_digest(path)[:12] if path.is_file() else "none"


def provenance() -> dict[str, str]:
    """Tags that say which code and pipeline state a run came from."""
    tags = {"clusterft.dvc_lock": _digest(Path("dvc.lock"))}
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10)
        if out.returncode == 0:
            tags["mlflow.source.git.commit"] = out.stdout.strip()
            tags["clusterft.git_dirty"] = str(bool(dirty.stdout.strip()))
    except (OSError, subprocess.SubprocessError):
        pass
    return tags


def datasets(cfg: Any) -> list[tuple[Any, str]]:
    """(MLflow dataset, context) for each data split file: its path and content digest."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    out = []
    for split in ("train", "validation", "test"):
        p = Path(getattr(cfg.data, split))
        if p.is_file():
            with warnings.catch_warnings():  # a local path matches two equal source kinds
                warnings.simplefilter("ignore", UserWarning)
                src = resolve_dataset_source(str(p.resolve()))
            out.append((MetaDataset(src, name=f"{p.name}", digest=_digest(p)), split))
    return out


class LiveTraining:
    """Rank 0's MLflow run for one training stage, written while it trains: params, tags
    and datasets at the start, the per-step curve every `train.log_every` steps with real
    timestamps, final metrics and the model at the end. A crashed run keeps what was sent."""

    KEYS = ("loss", "weighted_loss", "lr", "step_s", "compute_s", "sync_s", "tokens", "tokens_per_s",
            "peak_mem_mb", "val_macro_em", "val_worst_skill_em", "val_heldout_loss", "train_s", "eval_s")

    def __init__(self, cfg: Any, method: str, name: str, n_selected: int):
        self.client, self.run_id, self.buffer = None, None, []
        self.every = max(1, cfg.train.log_every)
        try:
            from mlflow import MlflowClient
            from mlflow.entities import DatasetInput, InputTag, Param

            exp = use_experiment(cfg)
            self.client = MlflowClient()
            tags = {"clusterft.stage": "train", "clusterft.method": method, "clusterft.run": name,
                    "clusterft.attempt": os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), **provenance()}
            self.run_id = self.client.create_run(exp, run_name=f"{name}/train", tags=tags).info.run_id
            params = [Param(k, v) for k, v in {**run_params(cfg), "method": method}.items()]
            for i in range(0, len(params), 90):
                self.client.log_batch(self.run_id, params=params[i:i + 90])
            inputs = [DatasetInput(ds._to_mlflow_entity(), [InputTag("mlflow.data.context", ctx)])
                      for ds, ctx in datasets(cfg)]
            self.client.log_inputs(self.run_id, datasets=inputs)
            self.client.log_metric(self.run_id, "n_selected", n_selected)
        except Exception as exc:  # noqa: BLE001 - tracking must never stop training
            log.warning("MLflow live tracking is off for this run: %s", exc)
            self.client = None

    def on_step(self, g: int, rec: dict) -> None:
        if self.client is None:
            return
        self.buffer.append(rec)
        if g % self.every == 0:
            self._flush()

    def _flush(self) -> None:
        try:
            _log_series(self.run_id, self.buffer, self.client)
        except Exception as exc:  # noqa: BLE001
            log.warning("MLflow: could not log training steps: %s", exc)
        self.buffer = []

    def finish(self, metrics: dict, model_dir: Path) -> str | None:
        """Final metrics and the saved model (its folder, as artifacts); return the run id."""
        if self.client is None:
            return None
        self._flush()
        try:
            from mlflow.entities import Metric

            final = [Metric(k, v, int(time.time() * 1000), 0) for k, v in _numeric(metrics).items()]
            self.client.log_batch(self.run_id, metrics=final)
            self.client.log_artifacts(self.run_id, str(model_dir), artifact_path="model")
            self.client.set_terminated(self.run_id, "FINISHED")
        except Exception as exc:  # noqa: BLE001
            log.warning("MLflow: could not finish the training run: %s", exc)
        return self.run_id


def _numeric(d: dict[str, Any]) -> dict[str, float]:
    """Flattened numeric leaves of a metrics dict (MLflow metrics must be numbers)."""
    out = {}
    for k, v in flatten(d).items():
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)) and v == v:  # drop NaN
            out[k.replace("/", "_")] = float(v)
    return out


def _log_series(run_id: str, series: list[dict], client: Any = None, batch: int = 900) -> None:
    """Per-step curves in batches (one call per step is slow on a sqlite store), stamped
    with each step's own wall clock."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    now = time.time()
    points = [Metric(k, float(rec[k]), int(1000 * rec.get("time", now)), int(rec["step"]))
              for rec in series for k in LiveTraining.KEYS if k in rec]
    client = client or MlflowClient()
    for i in range(0, len(points), batch):
        client.log_batch(run_id, metrics=points[i : i + batch])


def _adopt(run_id: str, parent_id: str) -> bool:
    """Nest an existing run (a live training run) under `parent_id`; False if it is gone
    (e.g. logged to another store)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient().set_tag(run_id, "mlflow.parentRunId", parent_id)
        return True
    except MlflowException:
        return False


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

    use_experiment(cfg)
    params, origin = run_params(cfg), provenance()
    with mlflow.start_run(run_name="pipeline", tags={"clusterft.kind": "pipeline", **origin}) as parent:
        mlflow.log_params(params)
        for ds, ctx in datasets(cfg):
            mlflow.log_input(ds, context=ctx)
        for stage, metrics in collected["shared"].items():
            _log_stage(mlflow, stage, metrics)
        for row in rows:
            method = row["method"]
            with mlflow.start_run(run_name=method, nested=True) as mrun:
                mlflow.set_tags({"clusterft.method": method, **origin})
                mlflow.log_params({**params, "method": method})
                mlflow.log_metrics(_numeric({k: v for k, v in row.items() if k != "method"}))
                mdir = cfg.artifact("methods", method)
                if (mdir / "plots").is_dir():
                    mlflow.log_artifacts(str(mdir / "plots"), artifact_path="plots")
                for stage, metrics in collected["methods"].get(method, {}).items():
                    live = metrics.get("mlflow_run_id") if stage == "train" else None
                    if live and _adopt(live, mrun.info.run_id):
                        continue  # the training run logged itself live; nest it here
                    series = None
                    if stage == "train" and (mdir / "train_log.jsonl").exists():
                        series = [json.loads(x) for x in (mdir / "train_log.jsonl").read_text().splitlines()]
                    _log_stage(mlflow, f"{method}/{stage}", metrics, series)
            mlflow.log_metrics({f"{method}.{k}": v for k, v in _numeric(row).items()})
        for a in artifacts:
            mlflow.log_artifact(str(a))
        return parent.info.run_id


def _run_file(cfg: Any, row: dict, name: str) -> Path | None:
    """A grid run's file: in its run folder, else where experiment.results_dir keeps it."""
    for folder in (cfg.method_dir(row["base_method"], row["run"]),
                   Path(cfg.experiment.results_dir) / row["run"] if cfg.experiment.results_dir else None):
        if folder is not None and (folder / name).exists():
            return folder / name
    return None


def log_experiment(cfg: Any, rows: list[dict], aggs: list[dict], artifacts: list[Path]) -> str:
    """Record an experiment grid: a parent run, one nested run per grid run (its params, its
    result row, its live training run adopted), the aggregates and the report files."""
    import mlflow

    use_experiment(cfg)
    with mlflow.start_run(run_name="experiment", tags={"clusterft.kind": "experiment", **provenance()}) as parent:
        mlflow.log_params(run_params(cfg))
        for r in rows:
            with mlflow.start_run(run_name=r["run"], nested=True) as child:
                p = _run_file(cfg, r, "params.json")  # the run's effective params, written by run_one
                mlflow.log_params({**(json.loads(p.read_text()) if p else {}),
                                   **{k: str(r[k]) for k in ("method", "budget", "seed")}})
                mlflow.log_metrics(_numeric(r))
                tm = _run_file(cfg, r, "train_metrics.json")
                live = json.loads(tm.read_text()).get("mlflow_run_id") if tm else None
                if live:
                    _adopt(live, child.info.run_id)
        for a in aggs:
            b = "full" if a["budget"] is None else f"{a['budget']:g}"
            mlflow.log_metrics({f"{a['method']}.b{b}.{k}": v for k, v in _numeric(a).items()})
        for p in artifacts:
            mlflow.log_artifact(str(p))
        return parent.info.run_id
