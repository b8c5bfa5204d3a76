import json

from mlflow.tracking import MlflowClient


def test_compare_table_has_every_method_with_times_and_saving(tiny_run):
    cfg = tiny_run["cfg"]
    rows = {r["method"]: r for r in json.loads(cfg.artifact("report", "compare.json").read_text())["rows"]}
    assert set(rows) == {"full", "cluster"}
    full, clu = rows["full"], rows["cluster"]
    assert full["warmup_s"] == 0 and clu["warmup_s"] > 0 and clu["features_s"] > 0
    parts = sum(clu[k] for k in ("warmup_s", "features_s", "cluster_s", "select_s", "allocate_s", "train_s"))
    assert abs(clu["end_to_end_s"] - parts) < 1e-9
    assert abs(clu["saving_vs_full_pct"] - 100 * (1 - clu["end_to_end_s"] / full["end_to_end_s"])) < 1e-9
    assert clu["kept_fraction"] == cfg.select.budget
    md = cfg.artifact("report", "compare.md").read_text()
    assert "| full |" in md and "| cluster |" in md and "saving vs full" in md and "| truncated |" in md
    tm = json.loads(cfg.artifact("methods", "cluster", "train_metrics.json").read_text())
    assert tm["truncation"]["n"] == round(cfg.select.budget * 240)  # counted over what was trained
    assert clu["truncated_fraction"] == tm["truncation"]["truncated_fraction"]
    ev = json.loads(cfg.artifact("methods", "cluster", "eval.json").read_text())
    assert set(ev["truncation"]) == {"test", "validation"} and ev["truncation"]["validation"]["n"] == 24


def test_mlflow_holds_parent_and_nested_stage_runs_with_wall_clock(tiny_run):
    cfg = tiny_run["cfg"]
    client = MlflowClient(tracking_uri=cfg.tracking.tracking_uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    runs = client.search_runs([exp.experiment_id])
    parent = client.get_run(tiny_run["summary"]["mlflow_run_id"])
    assert parent.data.tags["clusterft.kind"] == "pipeline"
    assert parent.data.params["select.budget"] == str(cfg.select.budget)
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert {"warmup", "features", "cluster", "full", "cluster"} <= set(children)
    assert children["warmup"].data.metrics["wall_clock_s"] > 0
    grand = {r.info.run_name: r for r in runs
             if r.data.tags.get("mlflow.parentRunId") == children["full"].info.run_id}
    assert {"full/select", "full/allocate", "full/train", "full/evaluate"} <= set(grand)
    train = grand["full/train"]
    assert train.data.metrics["wall_clock_s"] > 0
    history = client.get_metric_history(train.info.run_id, "loss")
    assert len(history) == train.data.metrics["steps"]


def test_training_runs_are_logged_live_with_params_dataset_and_model(tiny_run):
    cfg = tiny_run["cfg"]
    client = MlflowClient(tracking_uri=cfg.tracking.tracking_uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI's training view
    parent = client.get_run(tiny_run["summary"]["mlflow_run_id"])
    tm = json.loads(cfg.artifact("methods", "cluster", "train_metrics.json").read_text())
    train = client.get_run(tm["mlflow_run_id"])  # created by rank 0 when training started
    method_run = client.get_run(train.data.tags["mlflow.parentRunId"])
    assert method_run.info.run_name == "cluster" and train.info.status == "FINISHED"
    assert set(train.data.params) == set(parent.data.params) | {"method"}  # the same keys everywhere
    assert train.data.params["select.budget"] == str(cfg.select.budget)
    assert method_run.data.params["method"] == "cluster"
    assert train.data.tags["clusterft.dvc_lock"] and "mlflow.source.git.commit" in train.data.tags
    assert {d.dataset.name for d in train.inputs.dataset_inputs} == {"train.jsonl", "validation.jsonl", "test.jsonl"}
    stamps = [m.timestamp for m in client.get_metric_history(train.info.run_id, "loss")]
    assert len(stamps) == tm["steps"] and stamps == sorted(stamps) and stamps[-1] > stamps[0]
    assert any(a.path == "model" for a in client.list_artifacts(train.info.run_id))
