"""DDP and FSDP on 2 gloo ranks end with the weights one process reaches on the same plan; the exposed sync time is the wait for the slowest rank."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from clusterft.runtime.loop import train_on_plan, wait_summary
from clusterft.runtime.model import load_model
from clusterft.spec.config import TrainConfig
from tests.conftest import REPO
from tests.helpers.grad_case import CASE_WEIGHTS, case_plan, case_samples


@pytest.mark.parametrize("strategy,grad_accum,system", [("ddp", 1, (1, 2, 3)), ("fsdp", 1, (1, 2, 3)),
                                                        ("fsdp", 2, ())])
def test_two_ranks_end_with_the_weights_of_one_process_on_the_same_plan(tiny_model_dir, tmp_path, strategy,
                                                                        grad_accum, system):
    """3 uneven weighted steps (3 + 1 samples, 1 + 2, 2 + none) on 2 gloo ranks under DDP or
    FSDP2 end with the weights one process reaches on the same global steps: each update is
    the gradient of (1/B) sum_i w_i l_i over the whole step. With 2 micro-batches the ranks
    run different numbers of passes (FSDP pads them with zero-weight ones). The ranks take the
    fast loss (answer-only output layer; under DDP the shared system prompt run once, its
    gradients synced with the rest), the one process full logits over whole rows."""
    out = tmp_path / "weights.safetensors"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "tests/helpers/parallel_train.py"), str(tiny_model_dir), str(out), strategy, "0",
           str(grad_accum), ",".join(map(str, system))]
    subprocess.run(cmd, check=True, env=env, cwd=REPO, timeout=300)
    two_ranks = load_file(out)
    shared = strategy == "ddp" and system
    assert (tmp_path / "weights.safetensors.loss_path").read_text() == \
        ("answer positions, shared prefix" if shared else "answer positions")

    model = load_model(tiny_model_dir)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    train_on_plan(model, case_samples(system), np.array(CASE_WEIGHTS), case_plan(1),
                  TrainConfig(lr=0.5, warmup_ratio=0.0, fast_loss=False), optimizer=opt)  # full logits, whole rows
    moved = 0
    for n, p in model.named_parameters():
        torch.testing.assert_close(two_ranks[n], p.detach(), rtol=1e-4, atol=1e-5, msg=n)
        moved += int(not torch.equal(p.detach(), start[n]))
    assert moved == len(start), "every weight trained"


def test_ddp_sync_time_is_the_wait_for_the_slowest_rank(tiny_model_dir, tmp_path):
    """Rank 1 sleeps 0.4 s per forward: rank 1's compute holds the delay, rank 0's exposed sync
    (after its last gradient bucket) holds the wait, even though the all-reduce overlaps the
    backward."""
    out = tmp_path / "weights.safetensors"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "tests/helpers/parallel_train.py"), str(tiny_model_dir), str(out), "ddp", "0.4"]
    subprocess.run(cmd, check=True, env=env, cwd=REPO, timeout=300)
    steps = json.loads((tmp_path / "weights.safetensors.timings.json").read_text())
    for s in steps:
        assert s["rank_compute_s"][1] > 0.35 and s["rank_sync_s"][1] < 0.2
        assert s["rank_sync_s"][0] > 0.2 and s["rank_compute_s"][0] < 0.2
    assert wait_summary(steps)["straggler_s"] > 3 * 0.15
