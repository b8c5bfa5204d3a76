"""Real `dvc repro` of the generated dvc.yaml on a tiny config, in a temporary project: the
built-in benchmark, then your own model folder and data files with no edit to dvc.yaml."""

import json
import shutil

import pytest

from tests.conftest import tiny_params
from tests.helpers.dvc_project import commit, dvc, make_project, ran


def _json(out: str) -> dict:
    """The JSON object in `dvc status --json` output (warnings may come first)."""
    return json.loads(out[out.index("{"):])


def test_dvc_repro_end_to_end_cache_then_exp_run_reruns_only_what_changed(tmp_path):
    root = tmp_path / "proj"
    params = tiny_params(root, relative=True)
    make_project(root, params)

    first = dvc(root, "repro")
    assert {"make-benchmark", "prepare-model", "warmup", "features", "cluster", "select@cluster",
            "train@full", "train@cluster", "evaluate@cluster", "compare"} <= ran(first)
    table = (root / "artifacts/report/compare.md").read_text()
    assert "| full |" in table and "| cluster |" in table

    again = dvc(root, "repro")
    assert ran(again) == set()
    assert "Data and pipelines are up to date" in dvc(root, "status", "dvc.yaml")
    loss = root / "src/clusterft/core/losses.py"  # the code deps are derived: the loss reruns train
    text = loss.read_text()
    loss.write_text(text + "\n# edited\n")
    stale = set(_json(dvc(root, "status", "--json", "dvc.yaml")))
    assert {"train@full", "train@cluster", "evaluate@full", "evaluate@cluster"} <= stale
    assert not stale & {"make-benchmark", "cluster", "select@cluster", "compare"}
    loss.write_text(text)
    assert "Data and pipelines are up to date" in dvc(root, "status", "dvc.yaml")

    commit(root)  # the metrics JSON are visible to git (.gitignore), so the baseline holds them
    rerun = ran(dvc(root, "exp", "run", "-S", "select.budget=0.3"))
    assert {"select@cluster", "allocate@cluster", "train@cluster", "evaluate@cluster", "compare"} <= rerun
    assert not rerun & {"make-benchmark", "prepare-model", "warmup", "features", "cluster", "train@full"}
    sel = (root / "artifacts/methods/cluster/selection.jsonl").read_text().splitlines()
    assert len(sel) == 0.3 * params["benchmark"]["n_train"]
    shown = json.loads(dvc(root, "exp", "show", "--json"))
    exps = [r for e in shown for x in (e.get("experiments") or []) for r in x["revs"]]
    assert len(exps) == 1
    data = exps[0]["data"]
    assert data["params"]["params.yaml"]["data"]["select"]["budget"] == 0.3
    metrics = data["metrics"]
    assert metrics["artifacts/methods/cluster/select_metrics.json"]["data"]["kept_fraction"] == 0.3
    assert "macro_exact_match" in metrics["artifacts/methods/cluster/eval.json"]["data"]
    assert {"full", "cluster"} <= set(metrics["artifacts/report/compare.json"]["data"]["by_method"])
    baseline = next(e for e in shown if e["rev"] != "workspace")["data"]["metrics"]
    assert baseline["artifacts/methods/cluster/select_metrics.json"]["data"]["kept_fraction"] == 0.5


@pytest.mark.slow  # ~90 s; in `.ci/run`'s slow suite (the default suite stays under 15 minutes)
def test_dvc_repro_with_your_own_model_folder_and_data_files(tmp_path, tiny_model_dir):
    from clusterft.core.benchmark import generate
    from clusterft.spec.config import BenchmarkConfig

    model = tmp_path / "models" / "mine"  # outside the project, as a user's model usually is
    shutil.copytree(tiny_model_dir, model)
    root = tmp_path / "proj"
    root.mkdir()
    splits = generate(BenchmarkConfig(n_train=160, n_validation=16, n_test_per_skill=2, seed=5))
    (root / "data").mkdir()
    for name, recs in splits.items():
        (root / "data" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    params = tiny_params(root, relative=True)
    params["model"]["path"] = str(model)
    params["data"].update(train="data/train.jsonl", validation="data/validation.jsonl", test="data/test.jsonl")
    params["select"]["methods"] = ["cluster"]
    make_project(root, params)

    first = ran(dvc(root, "repro"))
    assert {"warmup", "features", "cluster", "train@cluster", "evaluate@cluster"} <= first
    sel = (root / "artifacts/methods/cluster/selection.jsonl").read_text().splitlines()
    assert len(sel) == round(params["select"]["budget"] * 160)  # the user's 160 samples, not the benchmark
    assert not (root / "artifacts/model/base/config.json").exists()  # no built-in model was built
    lock = (root / "dvc.lock").read_text()
    assert str(model) in lock and "data/train.jsonl" in lock  # both are tracked dependencies

    status = json.loads(dvc(root, "status", "--json", "dvc.yaml"))
    assert status == {}
    with open(root / "data/train.jsonl", "a") as f:  # the user's data changes ...
        f.write(json.dumps({**splits["train"][0], "id": "mine-1", "output": "changed"}) + "\n")
    (model / "tokenizer_config.json").write_text((model / "tokenizer_config.json").read_text() + "\n")  # ... and model
    changed = json.loads(dvc(root, "status", "--json", "dvc.yaml"))["warmup"][0]["changed deps"]
    assert changed == {"data/train.jsonl": "modified", str(model): "modified"}  # what `dvc repro` reruns from
