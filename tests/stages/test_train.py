import json
import subprocess
import sys
from types import SimpleNamespace

import torch

from clusterft.runtime.model import load_model
from clusterft.stages.train import run_summary
from tests.conftest import REPO


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


def test_validation_curve_is_sharded_timed_apart_and_ends_at_the_evaluated_model(tiny_run):
    """evaluate.every 0.5: two points (half way, the end) scored over both workers; their
    time is not training time; the last point is the saved model's own validation score."""
    from mlflow import MlflowClient

    cfg = tiny_run["cfg"]
    for m in cfg.select.methods:
        mdir = cfg.artifact("methods", m)
        metrics = json.loads((mdir / "train_metrics.json").read_text())
        ev = json.loads((mdir / "eval.json").read_text())
        curve = metrics["curve"]
        assert [p["step"] for p in curve] == [(metrics["steps"] + 1) // 2, metrics["steps"]]
        assert 0 < curve[0]["train_s"] < curve[1]["train_s"] <= metrics["wall_clock_s"]
        assert metrics["eval_during_train_s"] > 0
        assert curve[-1]["val_macro_em"] == ev["validation"]["macro_exact_match"]
        assert curve[-1]["val_skill_em"] == ev["validation"]["exact_match"]  # which skills still move
        assert abs(curve[-1]["val_heldout_loss"] - ev["heldout_loss"]) < 1e-3 * ev["heldout_loss"]
        history = MlflowClient(cfg.tracking.tracking_uri).get_metric_history(metrics["mlflow_run_id"], "val_macro_em")
        assert [h.value for h in history] == [p["val_macro_em"] for p in curve]


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


def test_cluster_dynamic_end_to_end_under_two_gloo_workers(tmp_path):
    """select writes the pool and the quotas, allocate the first epoch's plan, and training
    under torchrun draws a fresh balanced subset of the quota's size every epoch."""
    import json
    import subprocess
    import sys

    from clusterft.orchestration.launch import stage_functions
    from tests.conftest import REPO
    from tests.helpers.project import prepared

    params, cfg = prepared(tmp_path, lambda p: p["train"].update(epochs=3, dynamic_hard=0.5),
                           upto=("make-benchmark", "prepare-model", "warmup", "features", "cluster"))
    fns = stage_functions()
    sel = fns["select"](cfg, "cluster_dynamic")
    fns["allocate"](cfg, "cluster_dynamic")
    mdir = cfg.method_dir("cluster_dynamic")
    per_epoch = json.loads((mdir / "quotas.json").read_text())["per_epoch"]
    assert per_epoch == 120 and sel["n_selected"] > per_epoch and sel["kept_fraction"] == 0.5
    subprocess.run([sys.executable, "-m", "clusterft.cli", "train", "--params", str(params), "--method",
                    "cluster_dynamic"], check=True, cwd=REPO, timeout=600)
    m = json.loads((mdir / "train_metrics.json").read_text())
    assert m["world_size"] == 2 and m["samples_trained_per_epoch"] == [per_epoch] * 3
    log = [json.loads(line) for line in (mdir / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == m["steps"] == 3 * (per_epoch // 16) and log[-1]["weighted_loss"] < log[0]["weighted_loss"]


def test_a_run_says_every_loss_path_it_took_in_order():
    def step(path):
        return {"samples": 2, "weighted_loss": 1.0, "tokens": 10, "compute_s": 0.1, "peak_mem_mb": 1.0,
                "loss_path": path, "rank_compute_s": [0.1], "rank_sync_s": [0.0], "rank_tokens": [10]}

    history = [step("answer positions"), step("answer positions, shared prefix"), step("answer positions, shared prefix")]
    summary = run_summary(history, SimpleNamespace(kept_per_epoch=[6]), None)
    assert summary["loss_path_rank0"] == "answer positions then answer positions, shared prefix"
    assert run_summary(history[1:], SimpleNamespace(kept_per_epoch=[4]), None)["loss_path_rank0"] == \
        "answer positions, shared prefix"
