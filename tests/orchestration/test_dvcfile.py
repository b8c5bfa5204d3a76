"""The DVC files are generated from the stage table, with each stage's code deps derived from its module's imports (an edit to any of them reruns it)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from clusterft.orchestration.dvcfile import code_deps, dvc_yaml, write_dvc_files
from clusterft.spec.stages import BY_NAME, PIPELINE, STAGES
from tests.conftest import REPO


def test_committed_dvc_files_are_the_generated_ones():
    assert write_dvc_files(REPO, check=True) == [], "run `clusterft dvc-yaml` and commit"
    res = subprocess.run([sys.executable, "-m", "clusterft.cli", "dvc-yaml", "--check"], cwd=REPO,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_generated_dvc_yaml_follows_the_table_in_order_with_per_method_foreach():
    stages = yaml.safe_load(dvc_yaml("dvc.yaml"))["stages"]
    assert list(stages) == [s.name for s in PIPELINE]
    for s in PIPELINE:
        body = stages[s.name]["do"] if s.per_method else stages[s.name]
        assert ("foreach" in stages[s.name]) == s.per_method
        assert body["cmd"].split()[:2] == ["clusterft", s.name]  # torchrun comes from the CLI, once
        assert body["params"] == list(s.params)


CLOSURES = """import importlib, json, sys
out = {}
for module in sys.argv[1:]:
    for name in [m for m in sys.modules if m.split(".")[0] == "clusterft"]:
        del sys.modules[name]  # each stage module is imported afresh: its own closure, nothing else
    importlib.import_module("clusterft." + module)
    out[module] = sorted(m for m in sys.modules if m.split(".")[0] == "clusterft")
print(json.dumps(out))
"""


def test_code_deps_cover_every_module_each_stage_imports():
    """What an interpreter loads when it imports a stage's module (and, for the grid, every
    stage module it runs) is inside that stage's generated deps: an edit to any of them
    reruns the stage under `dvc repro`."""
    modules = sorted({s.func.split(":")[0] for s in STAGES})
    out = subprocess.run([sys.executable, "-c", CLOSURES, *modules], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    loaded = json.loads(out.stdout)
    for st in STAGES:
        deps = set(code_deps(st))
        assert all((REPO / d).is_file() for d in deps)
        for module in [s.func.split(":")[0] for s in (STAGES if st.runs_stages else [st])]:
            for name in loaded[module]:
                path = Path(importlib.util.find_spec(name).origin).resolve().relative_to(REPO / "src")
                assert f"src/{path.as_posix()}" in deps, (st.name, name)
    assert "src/clusterft/core/losses.py" in code_deps(BY_NAME["train"])  # the loss reruns training
