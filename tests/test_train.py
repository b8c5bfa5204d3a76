import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from clusterft.data import collate, per_sample_loss
from clusterft.model import load_model
from tests.conftest import REPO
from tests.helpers.grad_case import CASE_WEIGHTS, case_samples


def test_ddp_weighted_gradient_equals_single_process_weighted_mean(tiny_model_dir, tmp_path):
    """2 gloo ranks with 3 and 1 samples: DDP's averaged gradient must equal the gradient of
    (1/B) sum_i w_i l_i over the whole global step computed in one process."""
    out = tmp_path / "grads.safetensors"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "tests/helpers/ddp_grad.py"), str(tiny_model_dir), str(out)]
    subprocess.run(cmd, check=True, env=env, cwd=REPO, timeout=300)
    ddp = load_file(out)

    model = load_model(tiny_model_dir)
    batch = collate(case_samples(), 0)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    loss = (torch.tensor(CASE_WEIGHTS) * per_sample_loss(logits, batch["labels"])).mean()
    loss.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(ddp[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)


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
