"""benchmarks/device_check.sh (the prepared GPU check) runs end to end on CPU with a tiny
model: both timed checks print their figures and the time-to-accuracy part says why it is
skipped when the real profile is absent."""

import os
import subprocess
import sys

from tests.conftest import REPO


def test_device_check_script_runs_on_cpu_with_a_tiny_model(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "MODEL": str(tmp_path / "absent"),
           "CHECK_ARGS": "--tiny --samples 8 --batch 4 --length 16 --steps 2"}
    res = subprocess.run(["bash", "benchmarks/device_check.sh"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "per-sample LoRA gradients, tiny architecture" in res.stdout and "speed-up" in res.stdout
    assert "training tokens/s" in res.stdout and "bf16/fp32" in res.stdout
    assert "time-to-accuracy: skipped" in res.stdout
