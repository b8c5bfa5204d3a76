"""A real scheduled deployment: local Prefect server on 127.0.0.1 + `flows/deploy.py` serving
the pipeline flow, one triggered run of the tiny config to COMPLETED, every process stopped."""

import json
import os
import subprocess
import sys
import time
from urllib.parse import urlparse

import psutil

from tests.conftest import REPO, tiny_params
from tests.helpers.dvc_project import dvc, make_project, ran
from tests.helpers.dvc_project import env as dvc_env
from tests.helpers.prefect_server import prefect_server, tail, wait

DEPLOY = REPO / "flows" / "deploy.py"
REGISTER_S = 120
RUN_S = 240


def test_deploy_rejects_a_bad_params_file_before_serving(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text("select:\n  methodz: [full]\n")
    res = subprocess.run([sys.executable, str(DEPLOY), "--project", str(tmp_path)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env={**os.environ, "PREFECT_HOME": str(tmp_path / ".prefect")})
    assert res.returncode == 2 and "methodz" in res.stderr


def _listening(pid: int) -> list:
    """Listening addresses of `pid` and its live children (one that exits while being
    listed listens on nothing; `pid` itself must be alive)."""
    root = psutil.Process(pid)
    out = [c.laddr for c in root.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    for p in root.children(recursive=True):
        try:
            out += [c.laddr for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            continue
    return out


def _let_flow_run_process_exit(pid: int, timeout: float = 30) -> None:
    """The run's state turns final just before its subprocess exits; give it that time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            running = [c for c in psutil.Process(pid).children()
                       if "spawn_main" in " ".join(c.cmdline())]
        except psutil.Error:
            return
        if not running:
            return
        time.sleep(0.5)


def test_served_deployment_runs_the_pipeline_flow_on_a_local_server(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    params = tiny_params(root, relative=True)
    params["select"]["methods"] = ["full"]
    make_project(root, params)
    with prefect_server(tmp_path / "prefect") as (env, procs, logs):
        api = env["PREFECT_API_URL"]
        bound = _listening(procs["server"].pid)
        assert bound and all(a.ip == "127.0.0.1" for a in bound), bound
        assert any(a.port == urlparse(api).port for a in bound)

        logs["serve"] = tmp_path / "serve.log"
        with open(logs["serve"], "w") as log:  # stopped before the server: it pauses its schedule there
            procs["serve"] = subprocess.Popen(
                [sys.executable, str(DEPLOY), "--name", "ci", "--cron", "0 0 1 1 *", "--project", str(root)],
                env={**env, **dvc_env()}, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)

        monkeypatch.setenv("PREFECT_HOME", env["PREFECT_HOME"])
        monkeypatch.setenv("PREFECT_API_URL", api)
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            dep = wait("the deployment", REGISTER_S,
                       lambda: client.read_deployment_by_name("clusterft-pipeline/ci"), procs, logs)
            assert [s.schedule.cron for s in dep.schedules] == ["0 0 1 1 *"]
            assert dep.parameters == {"project": str(root)}
            run = client.create_flow_run_from_deployment(dep.id)
            final = wait("the flow run to finish", RUN_S,
                         lambda: (s := client.read_flow_run(run.id).state) is not None and s.is_final() and s,
                         procs, logs)
            assert final.is_completed(), f"{final}\n{tail(logs['serve'])}"
        _let_flow_run_process_exit(procs["serve"].pid)
        assert all(a.ip == "127.0.0.1" for a in _listening(procs["serve"].pid))
    metrics = json.loads((root / "artifacts/methods/full/train_metrics.json").read_text())
    assert metrics["world_size"] == 2
    assert (root / "artifacts/report/compare.md").exists()
    assert ran(dvc(root, "repro")) == set()  # the scheduled run kept DVC's lock current
