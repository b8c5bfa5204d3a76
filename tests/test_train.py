import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from clusterft.model import load_model
from clusterft.train_loop import train_on_plan, wait_summary
from tests.conftest import REPO
from tests.helpers.grad_case import CASE_WEIGHTS, case_plan, case_samples


@pytest.mark.parametrize("strategy,grad_accum", [("ddp", 1), ("fsdp", 1), ("fsdp", 2)])
def test_two_ranks_end_with_the_weights_of_one_process_on_the_same_plan(tiny_model_dir, tmp_path, strategy,
                                                                        grad_accum):
    """3 uneven weighted steps (3 + 1 samples, 1 + 2, 2 + none) on 2 gloo ranks under DDP or
    FSDP2 end with the weights one process reaches on the same global steps: each update is
    the gradient of (1/B) sum_i w_i l_i over the whole step. With 2 micro-batches the ranks
    run different numbers of passes (FSDP pads them with zero-weight ones)."""
    out = tmp_path / "weights.safetensors"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "tests/helpers/parallel_train.py"), str(tiny_model_dir), str(out), strategy, "0",
           str(grad_accum)]
    subprocess.run(cmd, check=True, env=env, cwd=REPO, timeout=300)
    two_ranks = load_file(out)

    model = load_model(tiny_model_dir)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    train_on_plan(model, case_samples(), np.array(CASE_WEIGHTS), case_plan(1), 0, 0, lr=0.5,
                  warmup_ratio=0.0, optimizer=opt)
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


def test_pipeline_training_ran_two_gloo_workers_and_saved_safetensors(tiny_run):
    cfg = tiny_run["cfg"]
    for m in cfg.select.methods:
        mdir = cfg.artifact("methods", m)
        metrics = json.loads((mdir / "train_metrics.json").read_text())
        assert metrics["world_size"] == 2 and metrics["backend"] == "gloo"
        log = [json.loads(l) for l in (mdir / "train_log.jsonl").read_text().splitlines()]
        assert len(log) == metrics["steps"] and all(r["step_s"] > 0 for r in log)
        assert list((mdir / "model").glob("*.safetensors"))
    full = json.loads((cfg.artifact("methods", "full") / "train_log.jsonl").read_text().splitlines()[-1])
    first = json.loads((cfg.artifact("methods", "full") / "train_log.jsonl").read_text().splitlines()[0])
    assert full["loss"] < first["loss"]


def test_bf16_accumulated_checkpointed_adafactor_training_end_to_end(tmp_path):
    """The scale-out options together through the real CLI and 2 gloo workers on the tiny model."""
    from tests.helpers.project import prepared

    params, cfg = prepared(tmp_path, lambda p: p["train"].update(
        precision="bf16", grad_accum=2, micro_batch_tokens=64, activation_checkpointing=True,
        optimizer="adafactor", checkpoint_every=3), upto=("make-benchmark", "prepare-model", "select", "allocate"))
    subprocess.run([sys.executable, "-m", "clusterft.cli", "train", "--params", str(params), "--method", "full"],
                   check=True, cwd=REPO, timeout=600)
    mdir = cfg.method_dir("full")
    m = json.loads((mdir / "train_metrics.json").read_text())
    assert m["world_size"] == 2 and m["tokens_per_s_rank0"] > 0 and m["peak_mem_mb_rank0"] > 0
    log = [json.loads(line) for line in (mdir / "train_log.jsonl").read_text().splitlines()]
    assert all(r["weighted_loss"] == r["weighted_loss"] for r in log)  # finite, no NaN
    assert log[-1]["weighted_loss"] < log[0]["weighted_loss"]
    assert any(f.suffix == ".safetensors" for f in (mdir / "model").iterdir())


def test_lora_under_fsdp_saves_the_merged_model(tmp_path):
    """LoRA adapters sharded with their frozen base (FSDP2, 2 gloo ranks): the unsharded
    weights are gathered on rank 0 and the adapter is merged into the saved model."""
    from tests.helpers.project import prepared

    params, cfg = prepared(tmp_path, lambda p: (p["train"].update(finetune="lora", strategy="fsdp", lr=0.05),
                                                p["lora"].update(target_modules=["q_proj", "v_proj"])),
                           upto=("make-benchmark", "prepare-model", "select", "allocate"))
    subprocess.run([sys.executable, "-m", "clusterft.cli", "train", "--params", str(params), "--method", "full"],
                   check=True, cwd=REPO, timeout=600)
    mdir = cfg.method_dir("full")
    assert json.loads((mdir / "train_metrics.json").read_text())["strategy"] == "fsdp"
    base, trained = load_model(cfg.model.path), load_model(mdir / "model")
    names = {n for n, _ in trained.named_parameters()}
    assert names == {n for n, _ in base.named_parameters()}  # merged: no adapter tensors left
    changed = [n for n, p in trained.named_parameters()
               if not torch.equal(p, dict(base.named_parameters())[n])]
    assert changed and all("q_proj" in n or "v_proj" in n for n in changed)
