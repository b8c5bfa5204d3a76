"""Crash and resume: SIGKILL one of two torchrun workers mid-training; the rerun resumes
from the last checkpoint, and the result equals an uninterrupted run. (The same resume
path serves `torchrun --max-restarts`, which restarts the workers in place.)"""

import json
import signal
import subprocess
import time

import psutil
import pytest
import torch
from safetensors.torch import load_file

from clusterft.orchestration.launch import launch, torchrun_command
from tests.conftest import REPO
from tests.helpers.project import prepared


def _weights(mdir):
    return load_file(str(next((mdir / "model").glob("*.safetensors"))))


@pytest.mark.parametrize("strategy,finetune", [
    pytest.param("ddp", "full", marks=pytest.mark.slow),  # ~1 min each: in `.ci/run`'s slow suite
    pytest.param("fsdp", "full", marks=pytest.mark.slow),
    pytest.param("fsdp", "lora", marks=pytest.mark.slow),
])
def test_sigkill_a_rank_then_resume_matches_uninterrupted_run(tmp_path, reliability, strategy, finetune):
    """Under FSDP every rank writes its shard of the checkpoint and reads it back (with LoRA:
    only the adapter and its optimizer state, the frozen base is not in the checkpoint)."""
    params, cfg = prepared(tmp_path, lambda p: p["train"].update(
        epochs=8, per_device_batch=2, checkpoint_every=5, max_restarts=0, strategy=strategy, finetune=finetune),
        upto=("make-benchmark", "prepare-model", "select", "allocate"))
    mdir = cfg.artifact("methods", "full")
    args = ["train", "--params", str(params), "--method", "full"]

    launch(2, args)
    clean = _weights(mdir)
    clean_metrics = json.loads((mdir / "train_metrics.json").read_text())
    for f in ("train_metrics.json", "train_log.jsonl"):
        (mdir / f).unlink()

    proc = subprocess.Popen(torchrun_command(2, args), cwd=REPO)
    try:
        meta = mdir / "checkpoint" / "meta.json"
        deadline = time.time() + 120
        while time.time() < deadline:
            if meta.exists() and json.loads(meta.read_text())["next_step"] >= 10:
                break
            time.sleep(0.02)
        else:
            pytest.fail("no checkpoint appeared")
        workers = [c for c in psutil.Process(proc.pid).children(recursive=True)
                   if "clusterft.cli" in " ".join(c.cmdline())]
        assert len(workers) == 2
        workers[-1].send_signal(signal.SIGKILL)
        assert proc.wait(timeout=120) != 0  # the crashed run fails ...
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (mdir / "checkpoint" / "meta.json").exists() and not (mdir / "train_metrics.json").exists()
    start = time.perf_counter()
    launch(2, args)  # ... and the rerun resumes from its last checkpoint
    recover = time.perf_counter() - start

    log = [json.loads(line) for line in (mdir / "train_log.jsonl").read_text().splitlines()]
    pids = [r["pid"] for r in log]
    assert len(set(pids)) == 2, "steps before the kill come from the checkpoint, later ones from the rerun"
    assert pids.index(pids[-1]) >= 10  # the rerun did not start from step 0
    assert [r["step"] for r in log] == list(range(clean_metrics["steps"]))
    resumed = json.loads((mdir / "train_metrics.json").read_text())
    assert resumed["final_loss"] == pytest.approx(clean_metrics["final_loss"], abs=1e-6)
    for name, tensor in _weights(mdir).items():
        torch.testing.assert_close(tensor, clean[name], rtol=0, atol=1e-6, msg=name)
    assert not (mdir / "checkpoint").exists()
    assert resumed["strategy"] == strategy
    reliability(f"SIGKILL of a training rank (torchrun, 2 workers, {strategy}, {finetune})",
                "the run failed; the rerun resumed from the last checkpoint "
                "(weights within 1e-6 of an uninterrupted run)",
                "yes", recover)
