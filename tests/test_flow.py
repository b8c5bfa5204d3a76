"""Real Prefect flow runs (ephemeral local server): the pipeline flow, then the experiment
comparison flow on the same tiny project."""

import json

from prefect.testing.utilities import prefect_test_harness

from tests.conftest import tiny_params, write_params


def test_prefect_pipeline_and_experiment_flows(tmp_path, monkeypatch):
    from flows.experiment import experiment
    from flows.pipeline import pipeline

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / ".prefect"))
    p = tiny_params(tmp_path)
    p["experiment"] = {"methods": ["full", "random"], "budgets": [0.5], "seeds": [3]}
    params = write_params(tmp_path, p)
    with prefect_test_harness(server_startup_timeout=120):
        state = pipeline(str(params), ["select.methods=[full, cluster]"], return_state=True)
        assert state.is_completed(), state
        exp_state = experiment(str(params), return_state=True)
    summary = state.result()
    rows = {r["method"]: r for r in summary["rows"]}
    assert set(rows) == {"full", "cluster"} and rows["cluster"]["features_s"] > 0
    assert json.loads((tmp_path / "artifacts/methods/cluster/train_metrics.json").read_text())["world_size"] == 2
    assert exp_state.is_completed(), exp_state
    aggs = {(a["method"], a["budget"]) for a in exp_state.result()["aggregate"]}
    assert aggs == {("full", None), ("random", 0.5)}
    assert (tmp_path / "artifacts/experiments/random-b0.5-s3/eval.json").exists()
