"""A real local Prefect server on 127.0.0.1 for the tests (a temporary PREFECT_HOME and
sqlite database), and the process handling its tests share: wait on a probe while the
processes live, stop a process with everything it started."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

SERVER_START_S = 150  # a fresh server runs its migrations first: ~25-40 s here


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no log)"


def wait(what: str, timeout: float, probe: Callable[[], Any], procs: dict, logs: dict) -> Any:
    """Poll `probe()` until it returns a truthy value; fail early if a process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, p in procs.items():
            if p.poll() is not None:
                pytest.fail(f"{name} exited ({p.returncode}) while waiting for {what}:\n{tail(logs[name])}")
        try:
            value = probe()
        except Exception:  # not up yet
            value = None
        if value:
            return value
        time.sleep(1.0)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}:\n"
                + "\n".join(f"--- {n}\n{tail(p)}" for n, p in logs.items()))


def stop(proc: subprocess.Popen) -> list[int]:
    """SIGTERM the process (and what it started), then SIGKILL whatever is left; return pids."""
    try:
        family = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = [proc.pid]
    for pid in family:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    for pid in family:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=10)
    return family


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def server_env(home: Path, port: int) -> dict:
    """The environment of the server, its workers and its clients (fast worker heartbeats and
    polls, so a lost worker shows in seconds)."""
    return {**os.environ, "PREFECT_HOME": str(home / ".prefect"), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
            "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_UI_ENABLED": "false", "DO_NOT_TRACK": "1",
            "PREFECT_WORKER_HEARTBEAT_SECONDS": "5", "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_LOGGING_LEVEL": "INFO", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


@contextmanager
def prefect_server(home: Path) -> Iterator[tuple[dict, dict, dict]]:
    """(env, procs, logs): a server up on 127.0.0.1 for the block; every process the test adds
    to `procs` is stopped after it, in the order added, then the server; none may survive."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = server_env(home, port)
    logs = {"server": home / "server.log"}
    procs: dict[str, subprocess.Popen] = {}
    stopped: list[int] = []
    try:
        with open(logs["server"], "w") as log:
            procs["server"] = subprocess.Popen(
                [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT)
        wait("the server's /health", SERVER_START_S,
             lambda: urllib.request.urlopen(f"{env['PREFECT_API_URL']}/health", timeout=5).status == 200, procs, logs)
        yield env, procs, logs
    finally:
        for name in [n for n in procs if n != "server"] + (["server"] if "server" in procs else []):
            stopped += stop(procs[name])
    survivors = [p for p in stopped if alive(p)]
    assert not survivors, f"processes left running: {survivors}"
