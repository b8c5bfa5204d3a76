"""Bad input through the real CLI: a clear message naming file / line / key, exit code 2,
and nothing already computed is lost."""

import json
import shutil
import time

import numpy as np
import pytest

from clusterft.cli import main
from tests.conftest import tiny_params, write_params


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A tiny project with data, model, fake features and clusters already computed."""
    root = tmp_path_factory.mktemp("bad")
    params = write_params(root, tiny_params(root))
    assert main(["make-benchmark", "--params", str(params)]) == 0
    assert main(["prepare-model", "--params", str(params)]) == 0
    art = root / "artifacts"
    (art / "features").mkdir()
    np.save(art / "features/features.npy", np.random.default_rng(0).normal(size=(240, 8)).astype(np.float32))
    assert main(["cluster", "--params", str(params)]) == 0
    return root, params


def run(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().err


def snapshot(root):
    return {p: p.read_bytes() for p in sorted((root / "artifacts").rglob("*")) if p.is_file()}


CASES = [
    # (id, setup(root) -> argv list, expected message parts)
    ("invalid-json", lambda r: _data(r, b'{"instruction": "x", "output": "y"}\n{"instruction": \n'),
     [":2:", "invalid JSON"]),
    ("empty-file", lambda r: _data(r, b""), ["no records (the file is empty)"]),
    ("missing-field", lambda r: _data(r, b'{"instruction": "x"}\n'), [":1:", "missing field 'output'"]),
    ("wrong-type", lambda r: _data(r, b'{"instruction": "x", "output": 7}\n'), [":1:", "'output' must be a string"]),
    ("not-utf8", lambda r: _data(r, b'{"instruction": "x", "output": "\xff"}\n'), [":1:", "not valid UTF-8"]),
    ("duplicate-id", lambda r: _data(r, b'{"id": 1, "instruction": "x", "output": "y"}\n'
                                         b'{"id": 1, "instruction": "z", "output": "y"}\n'),
     [":2:", "duplicate id '1'"]),
    ("wrong-schema", lambda r: _data(r, b'{"prompt": "x", "completion": "y"}\n'), [":1:", "neither Alpaca form"]),
    ("missing-data-file", lambda r: _edit(r, lambda p: p["data"].update(train=str(r / "nope.jsonl")),
                                          "select", "--method", "full"), ["nope.jsonl", "not found"]),
    ("budget-zero", lambda r: _edit(r, lambda p: p["select"].update(budget=0), "select", "--method", "cluster"),
     ["select.budget", "> 0"]),
    ("budget-fraction-above-one", lambda r: _edit(r, lambda p: p["select"].update(budget=1.5), "select",
                                                  "--method", "cluster"), ["select.budget", "whole"]),
    ("budget-count-above-n", lambda r: _edit(r, lambda p: p["select"].update(budget=100000), "select",
                                             "--method", "cluster"), ["select.budget=100000", "train has 240"]),
    ("k-above-n", lambda r: _edit(r, lambda p: p["cluster"].update(k=1000), "cluster"),
     ["cluster.k=1000", "N=240"]),
    ("k-below-one", lambda r: _edit(r, lambda p: p["cluster"].update(k=0), "cluster"), ["cluster.k", ">= 1"]),
    ("nproc-above-selection", lambda r: _edit(r, lambda p: (p["select"].update(budget=3), p["train"].update(nproc=8)),
                                              "allocate", "--method", "cluster", pre=("select", "--method", "cluster")),
     ["train.nproc=8", "only 3 selected"]),
    ("model-without-weights", lambda r: _edit(r, lambda p: p["model"].update(path=str(_no_weights(r))), "warmup"),
     ["no *.safetensors weights"]),
    ("model-path-missing", lambda r: _edit(r, lambda p: p["model"].update(path=str(r / "no-model")), "warmup"),
     ["no-model", "model folder not found"]),
    ("tokenizer-without-eos", lambda r: _edit(r, lambda p: p["model"].update(path=str(_no_eos(r))), "warmup"),
     ["tokenizer has no eos token"]),
    ("nan-features", lambda r: _nan_features(r), ["rows contain NaN/inf", "first rows [5]"]),
    ("unwritable-output", lambda r: _edit(r, lambda p: p["paths"].update(artifacts=str(_file(r) / "sub")),
                                          "make-benchmark"), ["a-file/sub", "cannot create output folder"]),
    ("benchmark-fewer-samples-than-skills", lambda r: _edit(r, lambda p: p["benchmark"].update(n_validation=5),
                                                            "make-benchmark"), ["benchmark.n_validation", "8 skills"]),
    ("params-unknown-key", lambda r: _raw_params(r, "cluster:\n  kk: 3\n"), ["cluster.kk", "unknown key"]),
    ("params-wrong-type", lambda r: _raw_params(r, "train:\n  epochs: many\n"), ["train.epochs", "integer"]),
    ("params-bad-method", lambda r: _raw_params(r, "select:\n  methods: [full, oracle]\n"),
     ["select.methods", "unknown method 'oracle'"]),
    ("unknown-test-skill", lambda r: _test_data(r, b'{"instruction": "x", "output": "y", "skill": "juggling"}\n'),
     [":1:", "skill 'juggling'", "does not occur in"]),
    ("stale-features", lambda r: _stale(r), ["labels.npy", "rerun features and cluster"]),
    # refused before torchrun starts: a restart would fail the same way on every rank
    ("train-plan-other-world-size", lambda r: _plan_for_two(r), ["plan is for 2 workers but training runs 3"]),
    ("train-without-plan", lambda r: _edit(r, lambda p: None, "train", "--method", "random"),
     ["no allocation plan", "clusterft allocate"]),
    ("run-name-outside-artifacts", lambda r: _edit(r, lambda p: None, "select", "--method", "full",
                                                   "--run-name", "../../x"), ["run name", "no path"]),
    ("unknown-method", lambda r: _edit(r, lambda p: None, "select", "--method", "oracle"),
     ["method 'oracle'", "known: full"]),
    ("lr-negative", lambda r: _raw_params(r, "train:\n  lr: -0.1\n"), ["train.lr", "must be in (0, inf]"]),
    ("log-every-zero", lambda r: _raw_params(r, "train:\n  log_every: 0\n"), ["train.log_every"]),
    ("features-from-other-data", lambda r: _features_from_other_data(r),
     ["features were computed from another version of", "rerun warmup, features and cluster"]),
    ("timeout-too-short", lambda r: _raw_params(r, "train:\n  timeout_s: 1\n"), ["train.timeout_s"]),
    ("precision-unknown", lambda r: _raw_params(r, "train:\n  precision: fp8\n"),
     ["train.precision", "must be one of", "bf16"]),
    ("grad-accum-zero", lambda r: _raw_params(r, "train:\n  grad_accum: 0\n"), ["train.grad_accum", "[1, inf]"]),
    ("clusters-from-other-features", lambda r: _clusters_from_other_features(r),
     ["clusters were computed from another version of", "rerun cluster"]),
    ("json-nested-too-deeply", lambda r: _data(r, b'{"instruction": "x", "output": ' + b"[" * 100000
                                               + b"]" * 100000 + b"}\n"), [":1:", "nested too deeply"]),
    ("json-object-nested-too-deeply", lambda r: _data(r, b'{"a": ' * 50000 + b"1" + b"}" * 50000 + b"\n"),
     [":1:", "nested too deeply"]),
    ("lone-surrogate", lambda r: _data(r, b'{"instruction": "x", "output": "\\ud800"}\n'),
     [":1:", "field 'output'", "U+D800", "lone surrogate"]),
    ("lone-low-surrogate-in-chat", lambda r: _data(r, b'{"messages": [{"role": "user", "content": "a\\udfffb"}, '
                                                   b'{"role": "assistant", "content": "y"}]}\n'),
     [":1:", "field 'messages[0].content'", "U+DFFF"]),
    ("data-file-is-a-folder", lambda r: _edit(r, lambda p: p["data"].update(train=str(r / "artifacts")), "select",
                                              "--method", "full"), ["data.train", "is a folder"]),
    ("max-length-one", lambda r: _raw_params(r, "data:\n  max_length: 1\n"),
     ["data.max_length", "[2, inf]", "a prompt token and an answer token"]),
    ("tracking-uri-unknown-scheme", lambda r: _raw_params(r, "tracking:\n  tracking_uri: bogus://x\n"),
     ["tracking.tracking_uri", "unknown store scheme 'bogus'"]),
    ("tracking-uri-empty", lambda r: _raw_params(r, "tracking:\n  tracking_uri: ''\n"),
     ["tracking.tracking_uri", "empty"]),
    ("tracking-server-unreachable", lambda r: _edit(r, lambda p: p["tracking"].update(tracking_uri="http://127.0.0.1:9"),
                                                    "cluster"), ["tracking.tracking_uri", "does not answer"]),
    ("params-nested-too-deeply", lambda r: _raw_params(r, "train:\n  lr: " + "[" * 5000 + "]" * 5000 + "\n"),
     ["params.yaml: invalid YAML: nested too deeply"]),
    ("params-lone-surrogate", lambda r: _raw_params(r, 'train:\n  lr: "\\ud800"\n'),
     ["train.lr", "U+D800", "lone surrogate"]),
    ("params-not-utf8", lambda r: _raw_params(r, b"train:\n  lr: \xff\n"), ["params.yaml: not valid UTF-8"]),
    ("params-file-is-a-folder", lambda r: ["cluster", "--params", str(_case_dir(r, "params-folder"))],
     ["is a folder, not a params file"]),
    ("override-lone-surrogate", lambda r: _edit(r, lambda p: None, "cluster", "--set", 'train.lr="\\udc00"'),
     ["override train.lr", "U+DC00"]),
    ("lora-no-target-modules", lambda r: _raw_params(r, "lora:\n  target_modules: []\n"),
     ["lora.target_modules", "at least 1 item"]),
    ("lora-target-module-missing", lambda r: _edit(r, lambda p: (p["lora"].update(target_modules=["nope_proj"]),
                                                                 p["features"].update(model="target")), "warmup"),
     ["lora.target_modules", "matches no module", "q_proj"]),
    ("no-methods", lambda r: _raw_params(r, "select:\n  methods: []\n"), ["select.methods", "at least 1 item"]),
    ("grid-without-budgets", lambda r: _raw_params(r, "experiment:\n  budgets: []\n"),
     ["experiment.budgets", "would run nothing"]),
    ("grid-without-seeds", lambda r: _raw_params(r, "experiment:\n  seeds: []\n"), ["experiment.seeds"]),
    ("eval-every-not-whole", lambda r: _raw_params(r, "evaluate:\n  every: 2.5\n"), ["evaluate.every", "whole"]),
    ("eval-every-negative", lambda r: _raw_params(r, "evaluate:\n  every: -1\n"), ["evaluate.every", "[0, inf]"]),
    ("eval-every-under-fsdp", lambda r: _raw_params(r, "evaluate:\n  every: 0.5\ntrain:\n  strategy: fsdp\n"),
     ["evaluate.every", "ddp"]),
    ("eval-every-without-scored-validation", lambda r: _no_scored_validation(r),
     ["evaluate.every", "no record to score"]),
    ("plan-from-other-selection", lambda r: _plan_from_other_selection(r),
     ["plan was built from another version of", "selection.jsonl", "rerun `clusterft allocate`"]),
]


def _clusters_from_other_features(root):
    """Clusters of the right size, computed before the features were recomputed."""
    d = _case_dir(root, "other-features")
    shutil.copytree(root / "artifacts/cluster", d / "art/cluster", dirs_exist_ok=True)
    (d / "art/features").mkdir(parents=True, exist_ok=True)
    np.save(d / "art/features/features.npy", np.ones((240, 8), np.float32))
    return _edit(root, lambda p: p["paths"].update(artifacts=str(d / "art")), "select", "--method", "cluster")


def _plan_from_other_selection(root):
    """A plan, then the selection rewritten under another budget without reallocating."""
    run = ("--method", "random", "--run-name", "other-selection")
    argv = _edit(root, lambda p: None, "allocate", *run, pre=("select", *run))
    assert main(argv) == 0
    p = tiny_params(root)
    p["select"]["budget"] = 0.25
    assert main(["select", "--params", str(write_params(_case_dir(root, "other-selection"), p)), *run]) == 0
    return ["train", "--params", argv[2], *run]


def _features_from_other_data(root):
    """Features and clusters of the same size, recorded as made from another train file."""
    d = _case_dir(root, "other-data")
    shutil.copytree(root / "artifacts/features", d / "art/features", dirs_exist_ok=True)
    shutil.copytree(root / "artifacts/cluster", d / "art/cluster", dirs_exist_ok=True)
    (d / "art/features/manifest.json").write_text(json.dumps({"data_digest": "0" * 40}))
    return _edit(root, lambda p: p["paths"].update(artifacts=str(d / "art")), "select", "--method", "cluster")


def _plan_for_two(root):
    argv = _edit(root, lambda p: None, "allocate", "--method", "full", pre=("select", "--method", "full"))
    assert main(argv) == 0
    return _edit(root, lambda p: p["train"].update(nproc=3), "train", "--method", "full")


def _case_dir(root, name):
    d = root / "cases" / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def _edit(root, edit, *argv, pre=None):
    p = tiny_params(root)
    edit(p)
    d = _case_dir(root, argv[0] + str(abs(hash(json.dumps(p, sort_keys=True, default=str)))))
    params = write_params(d, p)
    if pre:
        assert main([pre[0], "--params", str(params), *pre[1:]]) == 0
    return [argv[0], "--params", str(params), *argv[1:]]


def _data(root, content):
    path = root / f"train-{abs(hash(content))}.jsonl"
    path.write_bytes(content)
    return _edit(root, lambda p: p["data"].update(train=str(path)), "select", "--method", "full")


def _test_data(root, content):
    path = root / f"test-{abs(hash(content))}.jsonl"
    path.write_bytes(content)
    shutil.copytree(root / "artifacts/model/base", root / "artifacts/methods/full/model", dirs_exist_ok=True)
    return _edit(root, lambda p: p["data"].update(test=str(path)), "evaluate", "--method", "full")


def _no_scored_validation(root):
    path = root / "open-ended-validation.jsonl"
    path.write_text('{"instruction": "write", "output": "a poem", "exact_match": false}\n')
    return _edit(root, lambda p: (p["data"].update(validation=str(path)), p["evaluate"].update(every=0.5)),
                 "select", "--method", "full")


def _no_weights(root):
    d = root / "noweights"
    d.mkdir(exist_ok=True)
    shutil.copy(root / "artifacts/model/base/config.json", d)
    return d


def _no_eos(root):
    d = root / "noeos"
    shutil.copytree(root / "artifacts/model/base", d, dirs_exist_ok=True)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["eos_token"] = None
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = json.loads((d / "tokenizer.json").read_text())
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] != "<|eos|>"]
    (d / "tokenizer.json").write_text(json.dumps(tok))
    return d


def _nan_features(root):
    p = tiny_params(root)
    d = _case_dir(root, "nan")
    p["paths"]["artifacts"] = str(d / "artifacts")
    x = np.ones((20, 4), np.float32)
    x[5, 2] = np.nan
    (d / "artifacts/features").mkdir(parents=True)
    np.save(d / "artifacts/features/features.npy", x)
    return ["cluster", "--params", str(write_params(d, p))]


def _file(root):
    f = root / "a-file"
    f.write_text("x")
    return f


def _raw_params(root, text):
    d = _case_dir(root, f"raw{abs(hash(text))}")
    (d / "params.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
    return ["cluster", "--params", str(d / "params.yaml")]


def _stale(root):
    p = tiny_params(root)
    p["benchmark"]["n_train"] = 300
    d = _case_dir(root, "stale")
    p["data"]["train"] = str(d / "train.jsonl")
    params = write_params(d, p)
    from clusterft.core.benchmark import generate
    from clusterft.io.examples import write_jsonl
    from clusterft.spec.config import BenchmarkConfig

    write_jsonl(d / "train.jsonl", generate(BenchmarkConfig(n_train=300))["train"])
    return ["select", "--params", str(params), "--method", "cluster"]


@pytest.mark.parametrize("name, setup, parts", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_reported_and_nothing_is_lost(project, capsys, reliability, name, setup, parts):
    root, _ = project
    argv = setup(root)
    before = snapshot(root)
    start = time.perf_counter()
    code, err = run(capsys, *argv)
    refused_s = time.perf_counter() - start
    assert code == 2, err
    for part in parts:
        assert part in err, err
    assert err.startswith(f"clusterft {argv[0]}: error:")
    after = snapshot(root)
    assert {p: b for p, b in after.items() if p in before} == before  # nothing computed was lost
    message = err.split(": error: ", 1)[1].strip().replace(str(root) + "/", "").replace("|", "/")
    reliability(f"bad input: {name} (`clusterft {argv[0]}`)", f"exit 2: {message[:150]}",
                "refused; nothing lost", refused_s)

