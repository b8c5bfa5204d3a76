"""Stage `warmup`: the proxy trains from scratch on a seeded random fraction and keeps its
snapshots for loss trajectories; the target gets a LoRA adapter with its Adam moments."""

import json

import numpy as np
from safetensors import safe_open

from clusterft.io.moments import MOMENTS_FILE, load_adam_moments, state_dir
from clusterft.orchestration.launch import stage_functions
from clusterft.spec.config import load_config
from clusterft.stages.warmup import run_warmup, snapshot_steps, warmup_subset
from tests.conftest import tiny_params, write_params
from tests.helpers.project import prepared


def test_subset_and_snapshot_steps():
    a = warmup_subset(240, 0.1, 0)
    assert len(a) == 24 and (np.diff(a) > 0).all() and a.tolist() == warmup_subset(240, 0.1, 0).tolist()
    assert a.tolist() != warmup_subset(240, 0.1, 1).tolist() and len(warmup_subset(5, 0.01, 0)) == 1
    assert snapshot_steps(10, 4) == [2, 5, 8, 10] and snapshot_steps(3, 5) == [1, 2, 3]


def test_proxy_warmup_keeps_snapshots_for_loss_trajectories(tmp_path):
    _, cfg = prepared(tmp_path, lambda p: p["features"].update(kind="loss_traj"))
    m = run_warmup(cfg)
    out = state_dir(cfg)
    assert m["n_samples"] == 24 and m["steps"] == 3 and m["final_loss"] < m["first_loss"]
    assert sorted(p.name for p in (out / "snapshots").iterdir()) == [f"step-{s:06d}" for s in m["snapshots"]]
    assert (out / "proxy" / "tokenizer.json").exists() and (out / "proxy" / "model.safetensors").exists()
    again = run_warmup(cfg)  # a rerun starts clean: no snapshot of the old run is left behind
    assert again["final_loss"] == m["final_loss"]


def test_target_warmup_saves_the_adapter_and_its_moments(tmp_path):
    p = tiny_params(tmp_path)
    p["features"].update(model="target", kind="lora_grad")
    cfg = load_config(write_params(tmp_path, p))
    fns = stage_functions()
    for name in ("make-benchmark", "prepare-model", "warmup"):
        fns[name](cfg)
    adapter = state_dir(cfg) / "adapter"
    names = [k for k in json.loads((adapter / "adapter_config.json").read_text())]  # a peft adapter folder
    assert "target_modules" in names
    with safe_open(str(adapter / MOMENTS_FILE), "pt") as fh:
        keys = sorted({k.rsplit(".", 1)[0] for k in fh.keys()})
    moments = load_adam_moments(adapter / MOMENTS_FILE, keys)
    assert moments.exp_avg.shape == moments.exp_avg_sq.shape and float(moments.exp_avg_sq.min()) >= 0
