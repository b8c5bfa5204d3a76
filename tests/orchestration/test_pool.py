"""The experiment grid on a Prefect work pool, with real components: a local Prefect server on
127.0.0.1, a process work pool, real workers (`prefect worker start`) and `clusterft
experiment` submitting the grid's runs to them; the results match the in-process grid's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import tiny_params, write_params
from tests.helpers.prefect_server import prefect_server, stop, tail, wait

GRID = {"methods": ["full", "random"], "budgets": [0.5], "seeds": [0, 1]}
RUNS = {"full-s0", "full-s1", "random-b0.5-s0", "random-b0.5-s1"}
COMPARED = ("macro_em", "worst_skill_em", "heldout_loss", "steps", "kept_fraction", "trained_fraction")


def _project(root: Path, **experiment) -> Path:
    """A project folder with the tiny grid's params (paths relative: the workers run in it)."""
    p = tiny_params(root, relative=True)
    p["experiment"] = {**GRID, "zero_shot": False, **experiment}
    p["train"].update(nproc=1, epochs=3, checkpoint_every=2)  # ~90 steps: long enough to kill a run in
    root.mkdir(parents=True, exist_ok=True)
    write_params(root, p)
    return root


def _experiment(root: Path, env: dict, *overrides: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    args = [a for o in overrides for a in ("--set", o)]
    return subprocess.run([sys.executable, "-m", "clusterft.cli", "experiment", "--params", "params.yaml", *args],
                          cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def _rows(root: Path) -> dict[str, dict]:
    res = json.loads((root / "artifacts/experiments/results.json").read_text())
    return {r["run"]: {k: r[k] for k in COMPARED} for r in res["runs"]}


@contextmanager
def _workers(pool: str, names: tuple[str, ...], server: tuple, home: Path):
    """Real process workers of `pool` (one run at a time each), online for the block."""
    env, procs, logs = server
    home.mkdir(parents=True, exist_ok=True)
    try:
        for name in names:
            logs[name] = home / f"{name}.log"
            with open(logs[name], "w") as log:
                procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--name", name, "--type",
                     "process", "--limit", "1"], env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True)  # its own process group: the kill test takes it all down
        wait("the workers", 120, lambda: _workers_online(env, pool, set(names)), procs, logs)
        yield
    finally:
        for name in names:
            if name in procs:
                stop(procs.pop(name))


def _flow_runs(env: dict) -> list:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}), get_client(sync_client=True) as client:
        return client.read_flow_runs()


def _workers_online(env: dict, pool: str, names: set[str]) -> bool:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}), get_client(sync_client=True) as client:
        return names <= {w.name for w in client.read_workers_for_work_pool(pool)}


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    """The same grid, one run after the other in one process: the reference rows."""
    root = _project(tmp_path_factory.mktemp("inproc"))
    res = _experiment(root, {**os.environ, "PYTHONUNBUFFERED": "1"})
    assert res.returncode == 0, res.stderr[-4000:]
    return _rows(root)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with prefect_server(tmp_path_factory.mktemp("prefect")) as (env, procs, logs):
        yield env, procs, logs


@pytest.mark.slow
def test_unknown_pool_and_pool_without_worker_are_refused_before_any_run(server, tmp_path):
    env, _, _ = server
    root = _project(tmp_path)
    res = _experiment(root, env, "experiment.work_pool=nowhere")
    assert res.returncode == 2 and "no work pool 'nowhere'" in res.stderr, res.stderr[-3000:]
    subprocess.run([sys.executable, "-m", "prefect", "work-pool", "create", "idle", "--type", "process"], env=env,
                   check=True, capture_output=True, timeout=120)
    t0 = time.monotonic()
    res = _experiment(root, env, "experiment.work_pool=idle", "experiment.worker_timeout=3")
    assert res.returncode == 2 and "work pool 'idle' has no live worker after 3 s" in res.stderr, res.stderr[-3000:]
    assert time.monotonic() - t0 < 120
    assert _flow_runs(env) == [] and not (root / "artifacts/experiments").exists()  # nothing submitted or run
    res = _experiment(root, {k: v for k, v in env.items() if k != "PREFECT_API_URL"}, "experiment.work_pool=idle")
    assert res.returncode == 2 and "PREFECT_API_URL is not set" in res.stderr


@pytest.mark.slow
def test_grid_on_two_workers_matches_the_in_process_grid(server, in_process, tmp_path):
    env, _, logs = server
    root = _project(tmp_path / "proj", work_pool="spread")
    with _workers("spread", ("w1", "w2"), server, tmp_path / "workers"):
        res = _experiment(root, env)
        assert res.returncode == 0, res.stderr[-4000:] + "".join(tail(logs[w]) for w in ("w1", "w2"))
        runs = [fr for fr in _flow_runs(env) if fr.work_pool_name == "spread"]
        again = _experiment(root, env)  # a rerun reuses every finished run: nothing is submitted
        assert again.returncode == 0 and len([fr for fr in _flow_runs(env) if fr.work_pool_name == "spread"]) == 4
        bad = _project(tmp_path / "bad", work_pool="spread", methods=["full"], seeds=[0])
        lines = (root / "artifacts/benchmark/test.jsonl").read_text().splitlines(keepends=True)
        (bad / "test.jsonl").write_text(lines[0] + '{"instruction": "copy", "input": "a"}\n' + "".join(lines[1:]))
        refused = _experiment(bad, env, "data.test=test.jsonl")  # only the run's evaluate reads it
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert "test.jsonl:2: missing field 'output'" in refused.stderr and "full-s0" in refused.stderr, refused.stderr[-3000:]
        tries = [fr for fr in _flow_runs(env) if fr.name.startswith("full-s0-a") and fr.work_pool_name == "spread"]
        assert len(tries) == 2 and any(fr.state.name == "BadInput" for fr in tries)  # the first grid's + one: no retry
    assert _rows(root) == in_process  # run for run: same seeds, deterministic training
    assert {fr.name for fr in runs} == {f"{r}-a1" for r in RUNS} and all(fr.state.is_completed() for fr in runs)
    by_worker = {fr.labels["prefect.worker.name"] for fr in runs}
    assert by_worker == {"w1", "w2"}, by_worker  # spread over both
    for w in ("w1", "w2"):  # each worker's own log shows the runs it took
        took = {fr.name for fr in runs if fr.labels["prefect.worker.name"] == w}
        assert took and all(name in logs[w].read_text() for name in took)
    assert "| random | 0.5 | 2 |" in (root / "artifacts/experiments/report.md").read_text()


@pytest.mark.slow
def test_a_killed_worker_leaves_its_run_to_the_other_which_resumes_it(server, in_process, tmp_path):
    env, procs, logs = server
    root = _project(tmp_path / "proj", work_pool="faults")
    logs["grid"] = tmp_path / "grid.log"
    with _workers("faults", ("k1", "k2"), server, tmp_path / "workers"), open(logs["grid"], "w") as out:
        grid = subprocess.Popen([sys.executable, "-m", "clusterft.cli", "experiment", "--params", "params.yaml"],
                                cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)

        def k1_training():  # a run of k1's with a checkpoint on disk: kill its machine now
            for fr in _flow_runs(env):
                run = fr.name.rsplit("-a", 1)[0]
                if (fr.work_pool_name == "faults" and fr.state.is_running() and fr.infrastructure_pid
                        and (fr.labels or {}).get("prefect.worker.name") == "k1"
                        and (root / "artifacts/experiments" / run / "checkpoint").exists()):
                    return fr
            return None

        victim = wait("a training run on k1 with a checkpoint", 600, k1_training, {"k1": procs["k1"]}, logs)
        os.killpg(procs["k1"].pid, signal.SIGKILL)  # the worker and, as a lost machine would, its run
        os.killpg(int(victim.infrastructure_pid), signal.SIGKILL)
        code = grid.wait(timeout=1500)
        text = tail(logs["grid"], 20000)
        assert code == 0, text[-5000:] + tail(logs["k2"])
    assert _rows(root) == in_process  # every run, the same results
    run = victim.name.rsplit("-a", 1)[0]
    assert f"grid run {run}, attempt 1: worker k1 lost" in text
    second = next(fr for fr in _flow_runs(env) if fr.name == f"{run}-a2" and fr.work_pool_name == "faults")
    assert second.state.is_completed() and second.labels["prefect.worker.name"] == "k2"
    steps = [json.loads(line) for line in (root / "artifacts/experiments" / run / "train_log.jsonl").open()]
    assert len({s["pid"] for s in steps}) == 2  # resumed from its checkpoint by a second process
    assert [s["step"] for s in steps] == list(range(len(steps)))  # no step trained twice or skipped
