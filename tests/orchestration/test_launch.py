"""One launcher for every entry point: a one-worker stage runs in this process, a stage with
workers under torchrun with the table's worker count; the grid's shared stages go through
it, so the selection time a grid adds to a run is measured on the launch `dvc repro` uses."""

import json

import pytest

from clusterft.errors import LaunchError
from clusterft.orchestration.experiment import prepare_shared
from clusterft.orchestration.launch import run_stage, stage_argv, torchrun_command
from clusterft.spec.config import load_config
from tests.conftest import tiny_params, write_params


def test_argv_and_torchrun_command_rerun_the_same_stage():
    argv = stage_argv("train", "p.yaml", ["a.b=1"], "cluster", "run-1")
    assert argv == ["train", "--params", "p.yaml", "--set", "a.b=1", "--method", "cluster", "--run-name", "run-1"]
    cmd = torchrun_command(2, argv)
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--nproc_per_node=2"] and "--standalone" in cmd
    assert cmd[-len(argv) - 2:] == ["-m", "clusterft.cli", *argv]
    assert "--standalone" not in torchrun_command(2, argv, nnodes=2)


def test_grid_shared_stages_run_with_their_declared_workers(tmp_path):
    p = tiny_params(tmp_path)
    p["experiment"].update(methods=["cluster"], zero_shot=False)
    params = write_params(tmp_path, p)
    cfg = load_config(params)
    assert cfg.features.nproc == 2
    prepare_shared(cfg, str(params), [])
    features = json.loads(cfg.artifact("features", "metrics.json").read_text())
    assert features["world_size"] == 2  # torchrun, as under `dvc repro` (was one process in the grid)
    cluster = run_stage(cfg, "cluster", str(params), [])  # one worker: in this process, its metrics back
    assert cluster["k"] == cfg.cluster.k


def test_a_failed_torchrun_is_a_launch_error(tmp_path):
    params = write_params(tmp_path, tiny_params(tmp_path))
    cfg = load_config(params)  # features before warmup: every worker fails on the missing warmup state
    with pytest.raises(LaunchError, match="torchrun exited with code"):
        run_stage(load_config(params, ["features.model=target", "features.kind=lora_grad"]), "features",
                  str(params), ["features.model=target", "features.kind=lora_grad"])
    assert not cfg.artifact("features", "features.npy").exists()
