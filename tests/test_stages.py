"""The stage and method tables are the one declaration every entry point reads: the
committed DVC files are generated from them, the CLI offers exactly their stages, and each
entry names real code."""

import subprocess
import sys

import yaml

from clusterft.cli import build_parser
from clusterft.methods import METHODS
from clusterft.stages import PIPELINE, STAGES, dvc_yaml, write_dvc_files
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


def test_cli_offers_every_stage_and_method():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert {s.name for s in STAGES} <= set(sub.choices)
    assert all(m in sub.choices["select"].format_help() for m in METHODS)


def test_every_stage_names_real_code_files_and_functions():
    for s in STAGES:
        assert callable(s.function), s.name
        for d in s.deps:
            if d.startswith("src/"):
                assert (REPO / d).is_file(), (s.name, d)
        if s.workers:
            section, key = s.workers.split(".")
            assert hasattr(__import__("clusterft.config", fromlist=["x"]).PipelineConfig(), section)


def test_method_table_drives_the_grid_budgets():
    from clusterft.experiment import RunSpec, grid

    specs = grid(list(METHODS), [0.2, 0.4], [0])
    for m in METHODS.values():
        mine = [s for s in specs if s.method == m.name]
        assert len(mine) == (1 if m.budget is None else 2)
        if m.budget:
            assert f"{m.budget}=0.2" in RunSpec(m.name, 0.2, 0).overrides()
    for m in METHODS.values():
        assert set(m.needs) <= {s.name for s in STAGES if s.selection}
