"""A real `dvc repro` of dvc.yaml on a tiny config, in a temporary copy of the repo."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


from tests.conftest import REPO, tiny_params, write_params


def dvc(root, *args):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "DVC_NO_ANALYTICS": "1", "PYTHONPATH": str(REPO / "src")}
    res = subprocess.run(["dvc", *args], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout + res.stderr


def ran(output):
    return set(re.findall(r"Running stage '([^']+)'", output))


def test_dvc_repro_end_to_end_cache_and_partial_rerun(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    shutil.copy(REPO / "dvc.yaml", root)
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    params = tiny_params(root, relative=True)
    write_params(root, params)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    dvc(root, "init", "-q")

    first = dvc(root, "repro")
    assert {"make-benchmark", "prepare-model", "warmup", "features", "cluster", "select@cluster",
            "train@full", "train@cluster", "evaluate@cluster", "compare"} <= ran(first)
    table = (root / "artifacts/report/compare.md").read_text()
    assert "| full |" in table and "| cluster |" in table

    again = dvc(root, "repro")
    assert ran(again) == set()
    assert "Data and pipelines are up to date" in dvc(root, "status")

    params["select"]["budget"] = 0.3
    write_params(root, params)
    third = ran(dvc(root, "repro"))
    assert {"select@cluster", "allocate@cluster", "train@cluster", "evaluate@cluster", "compare"} <= third
    assert not third & {"make-benchmark", "prepare-model", "warmup", "features", "cluster", "train@full"}
    sel = (root / "artifacts/methods/cluster/selection.jsonl").read_text().splitlines()
    assert len(sel) == 0.3 * params["benchmark"]["n_train"]
