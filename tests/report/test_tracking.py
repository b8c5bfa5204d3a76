"""MLflow tracking on a real sqlite store in a temporary folder: a live training run keeps its
params, datasets and per-step curve with real timestamps; a store that fails never stops
training; the experiment kind opens the UI on runs and curves."""

import time

from mlflow import MlflowClient

from clusterft.report.tracking import EXPERIMENT_KIND, LiveTraining, run_params, tracking_uri, use_experiment
from clusterft.spec.config import load_config


def _cfg(tmp_path, uri=None):
    uri = uri or f"sqlite:///{tmp_path / 'ml.db'}"
    return load_config(None, [f"tracking.tracking_uri={uri}", "tracking.experiment=t", "train.log_every=2"])


def test_live_run_logs_params_datasets_and_the_curve(tmp_path):
    cfg = _cfg(tmp_path)
    live = LiveTraining(cfg, "cluster", "cluster", 12)
    now = time.time()
    for g in range(1, 6):
        live.on_step(g, {"step": g - 1, "loss": 1.0 / g, "weighted_loss": 1.0 / g, "lr": 0.1, "time": now + g})
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    run_id = live.finish({"final_loss": 0.2, "nested": {"x": 3}, "flag": True, "name": "a"}, model_dir)
    client = MlflowClient(tracking_uri(cfg))
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["method"] == "cluster"
    assert run.data.params["select.budget"] == str(cfg.select.budget)
    assert run.data.metrics["final_loss"] == 0.2 and run.data.metrics["nested.x"] == 3
    assert "flag" not in run.data.metrics and "name" not in run.data.metrics
    curve = client.get_metric_history(run_id, "weighted_loss")
    assert [m.step for m in curve] == [0, 1, 2, 3, 4]  # the last step flushed at finish
    assert curve[-1].timestamp == int(1000 * (now + 5))
    assert [a.path for a in client.list_artifacts(run_id)] == ["model"]
    exp = client.get_experiment_by_name("t")
    assert exp.tags["mlflow.experimentKind"] == EXPERIMENT_KIND


def test_a_store_that_cannot_be_reached_never_stops_training(tmp_path, caplog):
    (tmp_path / "a-file").write_text("")  # a store under a file cannot be created
    cfg = _cfg(tmp_path, f"sqlite:///{tmp_path / 'a-file' / 'ml.db'}")
    live = LiveTraining(cfg, "full", "full", 3)
    live.on_step(1, {"step": 0, "loss": 1.0})
    assert live.finish({"a": 1.0}, tmp_path) is None
    assert "MLflow live tracking is off" in caplog.text


def test_every_run_gets_the_same_flattened_params(tmp_path):
    a, b = run_params(_cfg(tmp_path)), run_params(load_config(None, ["select.budget=0.3"]))
    assert set(a) == set(b) and b["select.budget"] == "0.3" and "train.allocation" in a
    use_experiment(_cfg(tmp_path))
    assert MlflowClient(tracking_uri(_cfg(tmp_path))).get_experiment_by_name("t") is not None
