"""The probe stage (torchrun, 2 gloo workers) and select under a time budget: the probe
times the real training setup, select turns a time budget into a data budget that
training then follows, and an impossible budget is refused before anything is lost."""

import json
import subprocess
import sys

import pytest

from clusterft.orchestration.launch import stage_functions
from tests.conftest import tiny_params, write_params


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """Shared stages of the tiny pipeline, then the probe under a time budget."""
    from clusterft.orchestration.launch import run_stage
    from clusterft.spec.config import load_config

    root = tmp_path_factory.mktemp("probe")
    p = tiny_params(root)
    p["train"]["epochs"] = 3
    p["select"]["time_budget"] = 0.5
    params = write_params(root, p)
    cfg = load_config(params)
    for name in ("make-benchmark", "prepare-model", "warmup", "features", "cluster"):
        stage_functions()[name](cfg)
    run_stage(cfg, "probe", str(params), [])
    return root, params, cfg


def test_probe_steps_span_sample_sizes_and_separate_fixed_from_per_character_cost():
    import numpy as np

    from clusterft.core.timebudget import length_steps, padded_chars, step_cost

    chars = np.random.default_rng(0).integers(10, 500, size=6 * 8).astype(float)
    plan, step_chars = length_steps(chars, world=2, per_device_batch=4, seed=0)
    assert sorted(plan.table[:, 3].tolist()) == list(range(48)) and plan.steps_per_epoch == 6
    per_step = [np.sort(chars[plan.table[plan.table[:, 1] == s, 3]]) for s in range(6)]
    for s, c in enumerate(per_step):  # padded: each rank's longest sample, averaged over ranks
        t = plan.table[plan.table[:, 1] == s]
        assert step_chars[s] == np.mean([chars[t[t[:, 2] == r, 3]].max() for r in (0, 1)])
        assert c.min() <= step_chars[s] <= c.max()
    ordered = sorted(per_step, key=lambda c: c.mean())  # similar sizes per step, disjoint ranges
    assert all(a.max() <= b.min() for a, b in zip(ordered, ordered[1:]))
    assert all(set(plan.table[plan.table[:, 1] == s, 2]) == {0, 1} for s in range(6))
    assert padded_chars(np.full(20, 7.0), 4) == 7.0 and padded_chars(chars, 1) < padded_chars(chars, 8)
    x = np.array([50.0, 100.0, 200.0, 400.0])
    assert np.allclose(step_cost(x, 0.05 + 0.001 * x), (0.05, 0.001))
    assert step_cost(x, 0.3 - 0.0001 * x) == (pytest.approx(np.mean(0.3 - 0.0001 * x)), 0.0)  # no negative slope


def test_probe_times_the_training_setup(probed):
    root, _, cfg = probed
    m = json.loads(cfg.artifact("probe", "metrics.json").read_text())
    assert m["world_size"] == 2 and m["steps"] == cfg.select.probe_steps
    assert m["samples_per_step"] == 2 * cfg.train.per_device_batch
    assert m["checkpoint_s"] > 0 and m["checkpoint_every"] == cfg.train.checkpoint_every
    assert m["step_fixed_s"] >= 0 and m["step_per_char_s"] >= 0
    for key in ("setup_s", "step_s", "save_s", "encode_s", "padded_chars"):
        assert m[key] > 0, key
    assert not (cfg.artifact("probe", "model")).exists()  # the timed save is not kept


def room(cfg, share_of_full_loop: float, paid=("warmup", "features", "cluster", "probe")) -> float:
    """Seconds of time budget: the stages already spent, 0.15 s for select itself, training's
    fixed cost and this share of the full data's training steps (by the probe's model)."""
    from clusterft.core.timebudget import TimeModel
    from clusterft.spec.stages import stage

    probe = json.loads(cfg.artifact("probe", "metrics.json").read_text())
    tm = TimeModel.from_probe(probe)
    spent = sum(json.loads(stage(s).metrics_path(cfg).read_text())["wall_clock_s"]
                for s in paid)
    loop = cfg.benchmark.n_train * cfg.train.epochs * tm.sample_epoch_s(probe["padded_chars"])
    return spent + 0.15 + tm.fixed_s() + share_of_full_loop * loop


def test_select_plans_the_budget_and_training_follows_it(probed):
    from clusterft.orchestration.launch import run_stage
    from clusterft.spec.config import load_config

    root, params, cfg = probed
    sizes = {}
    for share in (0.3, 0.6):
        over = [f"select.time_budget={room(cfg, share):.3f}"]
        c = load_config(params, over)
        m = stage_functions()["select"](c, "cluster")
        plan = m["time_plan"]
        assert plan["planned_end_to_end_s"] <= plan["target_s"] + 1e-6
        assert m["trained_per_epoch"] == plan["samples_per_epoch"] and m["epochs"] == 3
        sizes[share] = m["trained_per_epoch"]
    assert sizes[0.3] < sizes[0.6] < cfg.benchmark.n_train  # more time buys more data
    stage_functions()["allocate"](c, "cluster")
    run_stage(c, "train", str(params), over, "cluster")
    tr = json.loads((c.method_dir("cluster") / "train_metrics.json").read_text())
    assert sum(tr["samples_trained_per_epoch"]) == 3 * sizes[0.6]
    # the probe's model of the run is in the right range (the benchmark checks it to 10%)
    assert plan["planned_train_s"] / 3 < tr["wall_clock_s"] < 3 * plan["planned_train_s"]


def test_cluster_dynamic_runs_fewer_epochs_when_the_budget_is_tight(probed):
    from clusterft.io.artifacts import write_json
    from clusterft.spec.config import load_config

    root, params, cfg = probed
    path = cfg.artifact("probe", "metrics.json")
    measured = json.loads(path.read_text())
    k = cfg.cluster.k
    try:  # a setup 100x slower than the tiny one: an epoch of k samples costs 0.4 s, above select's own time
        write_json(path, {**measured, "step_fixed_s": 1.6, "step_per_char_s": 0.0, "samples_per_step": 16})
        seconds = room(cfg, 0.0) + 1.6 * k * 0.1  # 0.1 s per sample-epoch: 1.6 epochs of k samples, not 3
        c = load_config(params, [f"select.time_budget={seconds:.3f}"])
        m = stage_functions()["select"](c, "cluster_dynamic")
        assert 1 <= m["epochs"] < 3 and m["trained_per_epoch"] >= k
        quotas = json.loads((c.method_dir("cluster_dynamic") / "quotas.json").read_text())
        assert quotas["epochs"] == m["epochs"]
        stage_functions()["allocate"](c, "cluster_dynamic")
        alloc = json.loads((c.method_dir("cluster_dynamic") / "allocate_metrics.json").read_text())
        assert alloc["epochs"] == m["epochs"]
        with pytest.raises(Exception, match="smallest time budget that fits"):  # a static subset cannot
            stage_functions()["select"](c, "cluster")
    finally:
        write_json(path, measured)


def test_a_budget_that_cannot_be_met_is_refused_and_nothing_is_lost(probed):
    from clusterft.spec.config import load_config

    root, params, cfg = probed
    stage_functions()["select"](load_config(params, [f"select.time_budget={room(cfg, 0.5, ('probe',)):.3f}"]), "random")
    feats = cfg.artifact("features", "features.npy").read_bytes()
    out = cfg.method_dir("random") / "selection.jsonl"
    before = out.read_bytes()
    res = subprocess.run([sys.executable, "-m", "clusterft.cli", "select", "--params", str(params),
                          "--method", "random", "--set", "select.time_budget=0.001"],
                         capture_output=True, text=True, cwd=root)
    assert res.returncode == 2, res.stderr
    assert "select.time_budget=0.001" in res.stderr and "smallest time budget that fits is" in res.stderr
    assert out.read_bytes() == before  # the last selection stays
    assert cfg.artifact("features", "features.npy").read_bytes() == feats
    assert cfg.artifact("probe", "metrics.json").exists()


def test_select_refuses_a_probe_of_another_setup(probed):
    from clusterft.errors import SelectionError
    from clusterft.spec.config import load_config

    root, params, cfg = probed
    c = load_config(params, ["train.per_device_batch=4"])
    with pytest.raises(SelectionError, match="rerun `clusterft probe`"):
        stage_functions()["select"](c, "random")


def test_time_budgets_in_the_experiment_grid(probed):
    """A grid axis: the time-budgeted run is its own series, pays the probe, and its report
    row shows the planned next to the measured end-to-end time."""
    from clusterft.orchestration.experiment import run_experiment

    root, params, cfg = probed
    tb = round(room(cfg, 0.5, paid=("probe",)), 2)
    sets = ["experiment.methods=[random]", "experiment.budgets=[]", "experiment.seeds=[0]",
            f"experiment.time_budgets=[{tb}]", "experiment.zero_shot=false"]
    summary = run_experiment(str(params), sets, progress=False)
    (row,) = summary["aggregate"]
    assert row["method"] == f"random-t{tb:g}" and 0 < row["kept_fraction"] < 1
    probe_s = json.loads(cfg.artifact("probe", "metrics.json").read_text())["wall_clock_s"]
    assert row["selection_s"] > probe_s  # random pays the probe under a time budget
    assert row["planned_end_to_end_s"] <= tb
    md = cfg.artifact("experiments", "report.md").read_text()
    assert f"| random-t{tb:g} | - | 1 |" in md and f"{row['planned_end_to_end_s']:.1f}" in md


def test_live_tracking_cost_is_timed_on_a_run_kept_out_of_the_ui(probed, tmp_path):
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    from clusterft.spec.config import load_config
    from clusterft.stages.probe import tracking_cost

    root, params, _ = probed
    cfg = load_config(params, ["tracking.live=true"])  # the module's store (the grid test's runs)
    seconds = tracking_cost(cfg, 10, tmp_path / "probe", save_s=0.5)
    assert seconds > 0.5
    client = MlflowClient(tracking_uri=cfg.tracking.tracking_uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)

    def named(view):
        return [r for r in client.search_runs([exp.experiment_id], run_view_type=view)
                if r.info.run_name == "probe/train"]

    assert named(ViewType.ACTIVE_ONLY) == [] and len(named(ViewType.DELETED_ONLY)) == 1


def test_each_config_logs_to_its_own_store_in_one_process(tmp_path, monkeypatch):
    """mlflow.set_tracking_uri writes MLFLOW_TRACKING_URI; a later config's store still wins,
    and use_experiment leaves no such variable for worker processes to inherit."""
    import os

    import mlflow

    from clusterft.report.tracking import tracking_uri, use_experiment
    from clusterft.spec.config import load_config

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # restored after the test
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'other.db'}")
    cfg = load_config(None, [f"tracking.tracking_uri=sqlite:///{tmp_path / 'mine.db'}"])
    assert tracking_uri(cfg) == f"sqlite:///{tmp_path / 'mine.db'}"
    use_experiment(cfg)
    assert "MLFLOW_TRACKING_URI" not in os.environ and mlflow.get_tracking_uri().endswith("mine.db")
