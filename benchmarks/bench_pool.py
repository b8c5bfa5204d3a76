"""The experiment grid on a Prefect work pool: its wall-clock with one worker against two
workers, on the same small grid, side by side in one run (issue 25).

    .venv/bin/python benchmarks/bench_pool.py

Starts a local Prefect server on 127.0.0.1 (a temporary home and database), one process work
pool, and for N = 1 then 2 that many workers (one run at a time each, `train.nproc: 1`, the
machine's cores split between them through OMP_NUM_THREADS, as GPUs would be through
CUDA_VISIBLE_DEVICES). Each N runs the grid (`run_experiment` with experiment.work_pool) in
its own artifacts folder; the timed part is the grid's runs and report (its `wall_clock_s`),
after the shared stages. Prints both wall-clocks, their ratio, and whether every run's
results are equal under both (they must be: same seeds, deterministic training).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

GRID = ["experiment.methods=[full, random]", "experiment.budgets=[0.5]", "experiment.seeds=[0, 1]",
        "experiment.time_budgets=[]", "experiment.zero_shot=false", "train.nproc=1", "tracking.live=false"]
COMPARED = ("macro_em", "worst_skill_em", "heldout_loss", "steps")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, probe, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if probe():
                return
        except Exception:  # not up yet
            pass
        time.sleep(1.0)
    raise SystemExit(f"timed out waiting for {what}")


def _online(pool: str, names: set[str]) -> bool:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return names <= {w.name for w in client.read_workers_for_work_pool(pool)}


def grid_on_workers(n: int, params: str, overrides: list[str], root: Path, env: dict) -> dict:
    """Run the grid on a pool of `n` workers; (wall-clock s, rows by run)."""
    from clusterft.orchestration.experiment import run_experiment
    from clusterft.spec.config import relocate

    pool, threads = f"bench-{n}", max(1, (os.cpu_count() or 2) // n)
    workers = []
    for i in range(n):
        log = open(root / f"{pool}-w{i}.log", "w")
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--name", f"{pool}-w{i}",
             "--type", "process", "--limit", "1"], env={**env, "OMP_NUM_THREADS": str(threads)},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        _wait(f"{n} workers", lambda: _online(pool, {f"{pool}-w{i}" for i in range(n)}))
        over = [*overrides, *GRID, *relocate(root / f"artifacts-{n}"), f"experiment.work_pool={pool}"]
        summary = run_experiment(params, over, progress=True)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=60)
    res = json.loads((root / f"artifacts-{n}" / "experiments" / "results.json").read_text())
    return {"wall_clock_s": summary["wall_clock_s"],
            "rows": {r["run"]: {k: r[k] for k in COMPARED} for r in res["runs"]}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=["benchmark.n_train=1200"],
                    help="extra overrides (default: benchmark.n_train=1200)")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-pool-"))
    port = _port()
    env = {**os.environ, "PREFECT_HOME": str(root / ".prefect"), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{root / 'prefect.db'}",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_UI_ENABLED": "false", "DO_NOT_TRACK": "1",
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    os.environ.update(env)  # this process submits the grid: the same server
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                               str(port)], env=env, stdout=open(root / "server.log", "w"), stderr=subprocess.STDOUT)
    try:
        _wait("the Prefect server", lambda: urllib.request.urlopen(f"{env['PREFECT_API_URL']}/health").status == 200)
        for n in (1, 2):
            subprocess.run([sys.executable, "-m", "prefect", "work-pool", "create", f"bench-{n}", "--type",
                            "process"], env=env, check=True, capture_output=True)
        params = str(Path(args.params).resolve())
        out = {n: grid_on_workers(n, params, args.overrides, root, env) for n in (1, 2)}
    finally:
        server.terminate()
        server.wait(timeout=60)
    one, two = out[1]["wall_clock_s"], out[2]["wall_clock_s"]
    print(f"grid {GRID[:3]} + {args.overrides}, {len(out[1]['rows'])} runs, {os.cpu_count()} cores")
    print(f"one worker:  {one:.1f} s")
    print(f"two workers: {two:.1f} s")
    print(f"two / one:   {two / one:.2f}x wall-clock ({one / two:.2f}x faster)")
    print(f"results equal run for run: {out[1]['rows'] == out[2]['rows']}")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
