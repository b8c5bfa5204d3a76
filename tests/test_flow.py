"""Real Prefect flow runs (ephemeral local server) over a real DVC project: every task is a
`dvc repro` of its stage, so `dvc repro` afterwards has nothing left to do, a second flow run
finishes without running a stage, and a bad-params failure is not retried."""

import time

import pytest
from prefect import flow
from prefect.testing.utilities import prefect_test_harness

from tests.conftest import tiny_params
from tests.helpers.dvc_project import dvc, make_project, ran


@pytest.mark.slow  # ~200 s; in `.ci/run`'s slow suite (the served deployment test stays default)
def test_prefect_flows_reproduce_the_dvc_stages(tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.pipeline import StageFailed, experiment, pipeline
    from tests.helpers.dvc_project import env

    for k, v in env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / ".prefect"))
    root = tmp_path / "proj"
    p = tiny_params(root, relative=True)
    p["experiment"] = {"methods": ["random"], "budgets": [0.5], "seeds": [3], "zero_shot": False}
    make_project(root, p)
    with prefect_test_harness(server_startup_timeout=120):
        state = pipeline(str(root), return_state=True)
        assert state.is_completed(), state
        assert ran(dvc(root, "repro")) == set()  # the flow left DVC's lock up to date

        start = time.perf_counter()
        again = pipeline(str(root), return_state=True)
        unchanged_s = time.perf_counter() - start
        exp_state = experiment(str(root), return_state=True)

        with open(root / "artifacts/benchmark/test.jsonl", "a") as f:
            f.write("{not json\n")  # refused by clusterft (exit 2): a retry would fail the same way
        bad = one_stage(str(root), "evaluate@full", return_state=True)
        with get_client(sync_client=True) as client:
            arts = {a.key for a in client.read_artifacts()}
            fid = bad.state_details.flow_run_id
            tries = [r.run_count for r in client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fid])))]
    assert again.is_completed() and unchanged_s < 60
    summary = state.result()
    rows = {r["method"]: r for r in summary["rows"]}
    assert set(rows) == {"full", "cluster"} and rows["cluster"]["features_s"] > 0
    assert "| cluster |" in summary["markdown"] and {"clusterft-compare", "clusterft-experiment"} <= arts
    assert exp_state.is_completed(), exp_state
    aggs = {(a["method"], a["budget"]) for a in exp_state.result()["aggregate"]}
    assert aggs == {("random", 0.5)}
    assert bad.is_failed() and tries == [1], tries
    exc = bad.result(raise_on_failure=False)
    assert isinstance(exc, StageFailed) and exc.deterministic and "test.jsonl" in str(exc)


@flow
def one_stage(project: str, target: str):
    from flows.pipeline import repro

    return repro.with_options(name=target)(project, target)
