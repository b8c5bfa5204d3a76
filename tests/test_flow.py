"""A real Prefect flow run of the pipeline on a tiny config (ephemeral local server)."""

import json

from prefect.testing.utilities import prefect_test_harness

from tests.conftest import tiny_params, write_params


def test_prefect_flow_runs_every_stage(tmp_path, monkeypatch):
    from flows.pipeline import pipeline

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / ".prefect"))
    params = write_params(tmp_path, tiny_params(tmp_path))
    with prefect_test_harness(server_startup_timeout=120):
        state = pipeline(str(params), ["select.methods=[full, cluster]"], return_state=True)
    assert state.is_completed(), state
    summary = state.result()
    rows = {r["method"]: r for r in summary["rows"]}
    assert set(rows) == {"full", "cluster"} and rows["cluster"]["features_s"] > 0
    assert json.loads((tmp_path / "artifacts/methods/cluster/train_metrics.json").read_text())["world_size"] == 2
