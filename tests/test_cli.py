"""The `clusterft` command line: every param listed from the config's own fields, a stage run
through the launcher, bad params and a bad method refused with exit 2 naming the key."""

import subprocess
import sys

from clusterft.cli import main
from clusterft.spec.config import params_help
from tests.conftest import REPO, tiny_params, write_params


def test_params_lists_every_field_with_its_default_and_help():
    out = subprocess.run([sys.executable, "-m", "clusterft.cli", "params"], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout.splitlines()
    fields = params_help()
    assert len(out) == len(fields)
    for line, (key, default, help_text) in zip(out, fields):
        assert line == f"{key} = {default!r}  # {help_text}"
    assert any(line.startswith("train.allocation = 'balanced'  # step plan") for line in out)


def test_a_stage_runs_and_writes_its_metrics(tmp_path, capsys):
    params = write_params(tmp_path, tiny_params(tmp_path))
    assert main(["make-benchmark", "--params", str(params), "--set", "benchmark.n_train=60"]) == 0
    assert (tmp_path / "artifacts/benchmark/train.jsonl").read_text().count("\n") == 60


def test_bad_params_and_methods_exit_2_with_the_key(tmp_path, capsys):
    params = write_params(tmp_path, tiny_params(tmp_path))
    assert main(["select", "--params", str(params), "--method", "oracle"]) == 2
    assert "method 'oracle': unknown; known: full" in capsys.readouterr().err
    assert main(["cluster", "--params", str(params), "--set", "cluster.k=0"]) == 2
    assert "cluster.k: must be >= 1" in capsys.readouterr().err
    assert main(["cluster", "--params", str(params), "--set", "train.lr=-1"]) == 2
    assert "train.lr: must be in (0, inf], got -1" in capsys.readouterr().err
