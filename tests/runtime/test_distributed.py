"""The process group: a world of one without torchrun; under torchrun with 2 gloo workers
every rank joins, and a sum over ranks adds every rank's values."""

import json
import os
import subprocess
import sys

import torch

from clusterft.runtime.distributed import init_distributed, sum_over_ranks
from tests.conftest import REPO

WORKER = """import json, os, sys, torch
from clusterft.runtime.distributed import cleanup, init_distributed, sum_over_ranks
info = init_distributed(timeout_s=60)
got = sum_over_ranks([info.rank + 1, 10], info.device)
if info.is_main:
    json.dump({"world": info.world_size, "backend": info.backend, "sum": got}, open(sys.argv[1], "w"))
cleanup()
"""


def test_without_torchrun_it_is_a_world_of_one(monkeypatch):
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    info = init_distributed()
    assert (info.rank, info.world_size, info.backend, info.is_main) == (0, 1, None, True)
    assert sum_over_ranks([3, 4], torch.device("cpu")) == [3, 4]


def test_two_gloo_workers_join_and_sum(tmp_path):
    script, out = tmp_path / "w.py", tmp_path / "out.json"
    script.write_text(WORKER)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                    str(script), str(out)], check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert json.loads(out.read_text()) == {"world": 2, "backend": "gloo", "sum": [3, 20]}
