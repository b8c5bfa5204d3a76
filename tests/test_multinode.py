"""Scale-out: two torchrun launchers (--nnodes 2, c10d rendezvous on localhost), one worker
each, train one method together as a world of two, with the settings the README gives for a
7B model (FSDP, bf16, accumulation, activation checkpointing)."""

import json
import socket
import subprocess
import sys
import uuid

from clusterft.orchestration.launch import stage_functions
from clusterft.spec.config import load_config
from tests.conftest import REPO, tiny_params, write_params

SCALE_SETTINGS = ["train.strategy=fsdp", "train.precision=bf16", "train.grad_accum=2",
                  "train.activation_checkpointing=true"]  # as in the README's multi-node command


def test_readme_multinode_command_uses_these_settings():
    readme = (REPO / "README.md").read_text()
    assert all(f"--set {kv}" in readme for kv in SCALE_SETTINGS)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_node_launch_with_c10d_rendezvous(tmp_path):
    params = write_params(tmp_path, tiny_params(tmp_path))
    cfg = load_config(params)
    fns = stage_functions()
    for name in ("make-benchmark", "prepare-model"):
        fns[name](cfg)
    fns["select"](cfg, "full")
    fns["allocate"](cfg, "full")  # plan for train.nproc = 2 workers in all
    endpoint, run_id = f"127.0.0.1:{_free_port()}", uuid.uuid4().hex[:8]
    node = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
            "-m", "clusterft.cli", "train", "--params", str(params), "--method", "full",
            *[a for kv in SCALE_SETTINGS for a in ("--set", kv)]]
    procs = [subprocess.Popen(node, cwd=REPO) for _ in range(2)]
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0]
    metrics = json.loads(cfg.artifact("methods", "full", "train_metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["backend"] == "gloo" and metrics["strategy"] == "fsdp"
    assert len(metrics["compute_s_per_rank"]) == 2
