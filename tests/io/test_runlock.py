"""One run per artifacts folder: a second run is refused with the holder's name, a crashed
holder leaves no stale lock, and the holder's own child processes are let through."""

import signal
import subprocess
import sys
import time

import pytest

from clusterft.cli import main
from clusterft.errors import BusyError
from clusterft.io.runlock import LOCK_FILE, artifacts_lock
from tests.conftest import REPO, tiny_params, write_params

HOLD = ("import sys, time\nfrom clusterft.io.runlock import artifacts_lock\n"
        "with artifacts_lock(sys.argv[1], 'holder under test'):\n    print('held', flush=True)\n"
        "    time.sleep(300)\n")


def _hold(folder):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True,
                            cwd=REPO)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_run_is_refused_until_the_holder_dies(tmp_path, capsys, reliability):
    art = tmp_path / "artifacts"
    params = write_params(tmp_path, tiny_params(tmp_path))
    holder = _hold(art)
    try:
        with pytest.raises(BusyError, match=rf"pid {holder.pid}: holder under test"):
            with artifacts_lock(art, "second"):
                pass
        assert main(["make-benchmark", "--params", str(params)]) == 2
        err = capsys.readouterr().err
        assert "another clusterft run is using this artifacts folder" in err and f"pid {holder.pid}" in err
        assert not (art / "benchmark").exists()  # refused before the stage wrote anything
    finally:
        holder.send_signal(signal.SIGKILL)  # a crash: the OS drops the lock with the process
        holder.wait()
    start = time.perf_counter()
    assert main(["make-benchmark", "--params", str(params)]) == 0
    assert time.perf_counter() - start < 60 and (art / "benchmark" / "train.jsonl").exists()
    assert (art / LOCK_FILE).read_text() == ""  # released, holder line cleared
    reliability("two clusterft runs on one artifacts folder; then the holder is SIGKILLed",
                "the second is refused (exit 2, names the holder's pid and command); after the kill the "
                "lock is free at once (no stale lock)", "yes", time.perf_counter() - start)


def test_nested_holders_and_children_pass(tmp_path):
    art = tmp_path / "artifacts"
    with artifacts_lock(art, "outer"):
        with artifacts_lock(art, "inner"):  # same process: the environment says it holds it
            pass
        child = subprocess.run([sys.executable, "-c", HOLD.replace("time.sleep(300)", "pass"), str(art)],
                               capture_output=True, text=True, cwd=REPO)
        assert child.returncode == 0 and "held" in child.stdout, child.stderr
    with artifacts_lock(art, "again"):
        pass
