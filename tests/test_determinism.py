"""Same params and seed -> byte-identical selection and plan, through the real stages."""

from clusterft.orchestration.launch import stage_functions
from clusterft.spec.config import load_config
from tests.conftest import tiny_params, write_params


def _run(root):
    root.mkdir()
    cfg = load_config(write_params(root, tiny_params(root)))
    fns = stage_functions()
    for name in ("make-benchmark", "prepare-model", "warmup", "features", "cluster"):
        fns[name](cfg)
    for m in ("cluster", "random"):
        fns["select"](cfg, m)
        fns["allocate"](cfg, m)
    return cfg


def test_two_runs_write_identical_selection_and_plan(tmp_path):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    for m in ("cluster", "random"):
        for f in ("selection.jsonl", "plan.npy", "plan.json"):
            assert a.artifact("methods", m, f).read_bytes() == b.artifact("methods", m, f).read_bytes(), (m, f)
    assert a.artifact("cluster", "labels.npy").read_bytes() == b.artifact("cluster", "labels.npy").read_bytes()
