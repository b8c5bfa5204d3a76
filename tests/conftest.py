"""Shared fixtures: a tiny but real pipeline configuration and one real run of it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `flows` is importable in tests

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")


def tiny_params(root: Path, relative: bool = False) -> dict:
    """Params for a pipeline that runs in seconds: 240 samples, 2-layer 32-wide model.

    relative=True keeps every path relative to `root` (as a DVC project needs)."""
    art = Path("artifacts") if relative else root / "artifacts"
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["paths"]["artifacts"] = str(art)
    p["benchmark"].update(n_train=240, n_validation=24, n_test_per_skill=2)
    p["data"].update(train=str(art / "benchmark/train.jsonl"), validation=str(art / "benchmark/validation.jsonl"),
                     test=str(art / "benchmark/test.jsonl"), max_length=48)
    p["model"]["path"] = str(art / "model/base")
    p["model"]["tiny"].update(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, vocab_size=300)
    p["warmup"].update(fraction=0.1, epochs=1, batch_size=8)
    p["cluster"].update(k=4, n_init=1)
    p["train"].update(epochs=1, per_device_batch=8, log_every=5)
    p["evaluate"].update(max_new_tokens=8)
    p["tracking"]["tracking_uri"] = "sqlite:///mlflow.db" if relative else f"sqlite:///{root / 'mlflow.db'}"
    p["tracking"]["live"] = False  # tiny_run and test_compare cover live training runs
    return p


def write_params(root: Path, params: dict) -> Path:
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved 2-layer, 32-wide built-in model (safetensors) with its trained tokenizer."""
    from clusterft.runtime.model import prepare_builtin
    from clusterft.spec.config import load_config

    out = tmp_path_factory.mktemp("m") / "base"
    cfg = load_config(None, ["model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
                             "model.tiny.intermediate_size=64", "model.tiny.vocab_size=300"])
    prepare_builtin(cfg, ["a b c d e f g h i j k l m n o p q r s t u v w x y z"] * 20, out)
    return out


@pytest.fixture(scope="session")
def tokenizer():
    """A byte-level BPE tokenizer trained on one template line (the data tests)."""
    from clusterft.runtime.model import train_tokenizer

    return train_tokenizer(["Instruction: copy\nInput: a b c\nResponse: a b c"] * 20, 300)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One real end-to-end run (torchrun training included) shared by read-only tests."""
    from clusterft.orchestration.launch import run_stage
    from clusterft.spec.config import load_config
    from clusterft.spec.stages import PIPELINE

    root = tmp_path_factory.mktemp("tiny_run")
    p = tiny_params(root)
    p["tracking"]["live"] = True
    p["evaluate"]["every"] = 0.5  # validation curves, sharded over the two workers
    params = write_params(root, p)
    cfg = load_config(params)
    summary = None
    for st in PIPELINE:  # the stage table's order and launch, as dvc.yaml and the Prefect flow run it
        for m in (cfg.select.methods if st.per_method else [None]):
            summary = run_stage(cfg, st.name, str(params), [], m)
    return {"root": root, "params": params, "cfg": cfg, "summary": summary}


@pytest.fixture
def reliability(request):
    """`reliability(case, happened, same_result, recover_s)` records one row of the reliability
    table; benchmarks/reliability.py collects the rows (CLUSTERFT_RELIABILITY names the file)."""
    import json

    rows: list[dict] = []
    yield lambda case, happened, same_result, recover_s: rows.append(
        {"case": case, "happened": happened, "same_result": same_result, "recover_s": round(recover_s, 1)})
    out = os.environ.get("CLUSTERFT_RELIABILITY")
    if out and rows and not getattr(request.node, "rep_call_failed", True):
        with open(out, "a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({"test": request.node.nodeid, **row}) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Let fixtures see whether their test's call phase failed (reliability rows only for passes)."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call_failed = rep.failed
