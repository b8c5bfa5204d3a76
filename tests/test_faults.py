"""Fault injection through the real entry points (slow; `bash scripts/test.sh -m slow`, which
CI runs after the default suite): SIGKILL of a features worker, of evaluation, of `dvc repro`
and of a Prefect flow run mid-stage; a corrupt checkpoint; a full disk while the features are
written; a second pipeline on the same artifacts. Each ends resumed to the same result or
refused with a message, and nothing already computed is lost. Each test records its row of
the reliability table (benchmarks/reliability.py)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import REPO, tiny_params
from tests.helpers.dvc_project import dvc, env, make_project, ran
from tests.helpers.project import prepared

pytestmark = pytest.mark.slow


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "clusterft.cli", *args]


def wait_for(predicate, timeout: float = 180, what: str = "condition") -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def checkpoint_at(mdir: Path, step: int):
    meta = mdir / "checkpoint" / "meta.json"

    def reached() -> bool:
        try:
            return json.loads(meta.read_text())["next_step"] >= step
        except (OSError, ValueError):
            return False
    return reached


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a process and every process it started (torchrun puts its workers in sessions
    of their own), as when its machine or job dies."""
    family = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=60)
    psutil.wait_procs(family, timeout=60)


def weights(folder: Path) -> dict:
    return load_file(str(next(folder.glob("*.safetensors"))))


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)


def long_training(p: dict) -> None:
    p["train"].update(epochs=6, per_device_batch=2, checkpoint_every=5, max_restarts=0)


def test_sigkill_a_features_worker_then_rerun_resumes(tmp_path, reliability):
    def update(p):
        p["benchmark"]["n_train"] = 4000  # a few seconds of features: time to kill a worker mid-way
        p["features"].update(model="target", kind="lora_grad", dim=256, shard_size=50, nproc=2)
    params, cfg = prepared(tmp_path, update, upto=("make-benchmark", "prepare-model", "warmup"))
    out = cfg.artifact("features")
    subprocess.run(cli("features", "--params", str(params)), check=True, cwd=REPO)
    clean = np.load(out / "features.npy")
    shutil.rmtree(out)

    proc = subprocess.Popen(cli("features", "--params", str(params)), cwd=REPO, start_new_session=True)
    wait_for(lambda: len(list((out / "shards").glob("shard-*.npy"))) >= 6, what="six feature shards")
    workers = [c for c in psutil.Process(proc.pid).children(recursive=True)
               if "clusterft.cli" in " ".join(c.cmdline()) and "torch.distributed.run" not in c.cmdline()]
    workers[-1].send_signal(signal.SIGKILL)
    assert proc.wait(timeout=120) != 0
    done = len(list((out / "shards").glob("shard-*.npy")))
    assert 6 <= done < 80 and not (out / "features.npy").exists()

    start = time.perf_counter()
    subprocess.run(cli("features", "--params", str(params)), check=True, cwd=REPO)
    recover = time.perf_counter() - start
    m = json.loads((out / "metrics.json").read_text())
    assert m["shards_reused"] == done and m["shards_computed"] + m["shards_reused"] == 80
    np.testing.assert_allclose(np.load(out / "features.npy"), clean, rtol=0, atol=1e-6)
    reliability("SIGKILL of a features worker (torchrun, 2 workers)",
                f"the run failed; the rerun reused the {m['shards_reused']} of 80 shards finished before the kill",
                "yes", recover)


def test_sigkill_evaluation_then_rerun(tmp_path, reliability):
    params, cfg = prepared(tmp_path, upto=("make-benchmark", "prepare-model", "select", "allocate"))
    subprocess.run(cli("train", "--params", str(params), "--method", "full"), check=True, cwd=REPO)
    mdir = cfg.method_dir("full")
    subprocess.run(cli("evaluate", "--params", str(params), "--method", "full"), check=True, cwd=REPO)
    clean = json.loads((mdir / "eval.json").read_text())
    before = {p: p.read_bytes() for p in mdir.rglob("*") if p.is_file()}

    proc = subprocess.Popen(cli("evaluate", "--params", str(params), "--method", "full"), cwd=REPO,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    buf = ""
    while "evaluate (generate)" not in buf:  # killed while it generates
        char = proc.stderr.read(1)
        assert char, f"evaluation ended before generating: {buf[-2000:]}"
        buf += char
    kill_group(proc)
    assert {p: p.read_bytes() for p in mdir.rglob("*") if p.is_file()} == before  # nothing lost

    start = time.perf_counter()
    subprocess.run(cli("evaluate", "--params", str(params), "--method", "full"), check=True, cwd=REPO)
    recover = time.perf_counter() - start
    again = json.loads((mdir / "eval.json").read_text())
    clean.pop("wall_clock_s"), again.pop("wall_clock_s")
    assert again == clean
    reliability("SIGKILL of evaluation mid-generation",
                "eval.json and the model were untouched; the rerun evaluates from the start", "yes", recover)


def test_corrupt_checkpoint_after_a_crash_restarts_clean(tmp_path, reliability):
    params, cfg = prepared(tmp_path, long_training, upto=("make-benchmark", "prepare-model", "select", "allocate"))
    mdir = cfg.method_dir("full")
    args = cli("train", "--params", str(params), "--method", "full")
    subprocess.run(args, check=True, cwd=REPO)
    clean = weights(mdir / "model")
    for f in ("train_metrics.json", "train_log.jsonl"):
        (mdir / f).unlink()

    proc = subprocess.Popen(args, cwd=REPO, start_new_session=True)
    wait_for(checkpoint_at(mdir, 10), what="a checkpoint")
    kill_group(proc)
    for d in ("checkpoint", "checkpoint.old"):  # (.old when the kill landed mid-swap)
        w = mdir / d / "trainable.safetensors"
        if w.exists():
            w.write_bytes(w.read_bytes()[: w.stat().st_size // 3])  # a disk error tore the file

    start = time.perf_counter()
    res = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    recover = time.perf_counter() - start
    assert res.returncode == 0, res.stderr[-3000:]
    assert "checkpoint not used" in res.stderr  # (then the previous one, or step 0)
    assert_same_weights(weights(mdir / "model"), clean)
    reliability("corrupt checkpoint (weights file torn) after a crash",
                "a warning names it; training restarts from step 0", "yes", recover)


def test_full_disk_while_writing_features_keeps_the_finished_shards(tmp_path, reliability):
    def update(p):
        p["features"].update(shard_size=16, nproc=1)
    params, cfg = prepared(tmp_path, update, upto=("make-benchmark", "prepare-model", "warmup"))
    out = cfg.artifact("features")
    subprocess.run(cli("features", "--params", str(params)), check=True, cwd=REPO)
    clean = np.load(out / "features.npy")
    shutil.rmtree(out)

    limit = clean[:40].nbytes  # room for every shard file, not for the merged array

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    res = subprocess.run(cli("features", "--params", str(params)), cwd=REPO, capture_output=True, text=True,
                         preexec_fn=small_disk)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "features.npy: cannot write" in res.stderr and "finished work is kept" in res.stderr
    assert len(list((out / "shards").glob("shard-*.npy"))) == 15  # every computed shard is kept
    assert not list(out.rglob(".*.tmp")) and not (out / "features.npy").exists()

    start = time.perf_counter()
    subprocess.run(cli("features", "--params", str(params)), check=True, cwd=REPO)
    recover = time.perf_counter() - start
    assert json.loads((out / "metrics.json").read_text())["shards_computed"] == 0
    np.testing.assert_allclose(np.load(out / "features.npy"), clean, rtol=0, atol=0)
    reliability("full disk while writing features.npy (file-size limit)",
                "exit 2 naming the file; all 15 shards kept, no temp file; the rerun only merges",
                "yes", recover)


def _dvc_project(tmp_path: Path) -> Path:
    """A DVC project whose training lasts ~20 s: time to start a second run before the kill."""
    p = tiny_params(tmp_path / "proj", relative=True)
    p["select"]["methods"] = ["full"]
    long_training(p)
    p["train"]["epochs"] = 20
    return make_project(tmp_path / "proj", p)


def _resumed(mdir: Path) -> None:
    pids = [json.loads(line)["pid"] for line in (mdir / "train_log.jsonl").read_text().splitlines()]
    assert len(set(pids)) == 2 and pids.index(pids[-1]) >= 10, "the rerun resumed, not restarted"


def test_sigkill_dvc_repro_mid_training_then_rerun(tmp_path, reliability):
    root = _dvc_project(tmp_path)
    mdir = root / "artifacts/methods/full"
    proc = subprocess.Popen(["dvc", "repro"], cwd=root, env=env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(checkpoint_at(mdir, 10), timeout=600, what="training under dvc repro")
    second = dvc(root, "repro", ok=False)  # a second pipeline on the same project meanwhile
    assert "lock" in second.lower(), second
    assert proc.poll() is None and not (mdir / "train_metrics.json").exists()  # still training
    kill_group(proc)

    start = time.perf_counter()
    out = dvc(root, "repro")
    recover = time.perf_counter() - start
    assert "warmup" not in ran(out) and "train@full" in ran(out)  # finished stages were kept
    _resumed(mdir)
    assert "Data and pipelines are up to date" in dvc(root, "status", "dvc.yaml")
    resumed = weights(mdir / "model")
    shutil.rmtree(mdir / "model")
    subprocess.run(cli("train", "--params", "params.yaml", "--method", "full"), cwd=root, env=env(), check=True)
    assert_same_weights(resumed, weights(mdir / "model"))
    reliability("SIGKILL of `dvc repro` (and its workers) mid-training",
                "the second `dvc repro` meanwhile: refused by DVC's lock; the rerun keeps the finished "
                "stages and resumes training from its checkpoint", "yes", recover)


def test_sigkill_prefect_flow_mid_training_then_rerun(tmp_path, reliability):
    root = _dvc_project(tmp_path)
    mdir = root / "artifacts/methods/full"
    flow_env = {**env(), "PREFECT_HOME": str(tmp_path / ".prefect"), "PYTHONPATH": f"{REPO}/src:{REPO}"}
    flow = [sys.executable, str(REPO / "flows/pipeline.py"), str(root)]
    proc = subprocess.Popen(flow, cwd=root, env=flow_env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(checkpoint_at(mdir, 10), timeout=600, what="training under the Prefect flow")
    refused = subprocess.run(cli("cluster", "--params", "params.yaml"), cwd=root, env=env(),
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "Prefect flow clusterft-pipeline" in refused.stderr, refused.stderr
    assert proc.poll() is None and not (mdir / "train_metrics.json").exists()  # still training
    kill_group(proc)

    start = time.perf_counter()
    res = subprocess.run(flow, cwd=root, env=flow_env, capture_output=True, text=True, timeout=900)
    recover = time.perf_counter() - start
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    _resumed(mdir)
    assert "Data and pipelines are up to date" in dvc(root, "status", "dvc.yaml")
    assert json.loads((root / "artifacts/report/compare.json").read_text())["by_method"]
    reliability("SIGKILL of a Prefect flow run mid-training",
                "a `clusterft` stage started meanwhile: refused (exit 2, names the flow); the flow rerun "
                "resumes training from its checkpoint", "yes", recover)
