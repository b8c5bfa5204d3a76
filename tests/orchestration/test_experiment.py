"""The experiment grid on a tiny config: every run trains under torchrun, the report has
every (method, budget) with its seed spread, and a rerun reuses finished runs."""

import json
import logging
import shutil

import pytest

from clusterft.orchestration.experiment import RUN_SECTIONS, TIME_BUDGET_KEYS, params_digest, run_digest, run_experiment
from clusterft.report.grid import aggregate, at_equal_time, equal_time_markdown, machines_note
from clusterft.spec.config import load_config
from clusterft.spec.grid import RunSpec, grid
from tests.conftest import tiny_params, write_params


def test_grid_shape_and_names():
    specs = grid(["full", "cluster", "infobatch"], [0.1, 0.5], [0, 1])
    assert len(specs) == 2 * (1 + 2 + 1)
    assert RunSpec("cluster", 0.5, 1).name == "cluster-b0.5-s1" and RunSpec("full", None, 0).name == "full-s0"
    assert "select.paper_ratio=0.3" in RunSpec("cluster_paper", 0.3, 0).overrides()


def test_a_param_added_later_keeps_the_digest_of_runs_made_before_it_at_its_old_value():
    """train.fast_loss: false is the path runs kept before it existed took: their digests hold;
    the new default (true) is another path, so its runs are new ones."""
    spec = RunSpec("full", None, 0)
    old, new = load_config(None, ["train.fast_loss=false"]), load_config(None)
    assert run_digest(old, spec) == params_digest(old, RUN_SECTIONS, ("train.fast_loss", *TIME_BUDGET_KEYS))
    assert run_digest(new, spec) != run_digest(old, spec)


def test_aggregate_mean_and_spread():
    rows = [dict(method="full", budget=None, seed=s, kept_fraction=1, trained_fraction=1, selection_s=0,
                 train_s=10.0 + s, end_to_end_s=10.0 + s, macro_em=0.5 + 0.1 * s, worst_skill_em=0.2,
                 heldout_loss=1.0) for s in (0, 2)]
    (a,) = aggregate(rows)
    assert a["seeds"] == 2 and a["macro_em"] == 0.6 and abs(a["macro_em_std"] - 0.1) < 1e-12
    assert a["time_vs_full_train"] == 1.0


def test_equal_time_interpolates_between_budgets_and_never_extrapolates():
    def agg(method, t, em):
        return {"method": method, "end_to_end_s": t, "train_s": t, "macro_em": em, "worst_skill_em": em / 2,
                "time_vs_full_train": t / 100.0}

    aggs = [agg("full", 100.0, 0.9), agg("cluster", 20.0, 0.4), agg("cluster", 60.0, 0.8),
            agg("infobatch", 70.0, 0.85)]
    at = at_equal_time(aggs, 50.0, "macro_em")
    assert at["cluster"] == (0.7, True) and at["full"] is None and at["infobatch"] is None
    assert at_equal_time(aggs, 70.5, "macro_em")["infobatch"] == (0.85, False)  # its own point
    assert at_equal_time(aggs, 80.0, "macro_em")["cluster"] is None  # beyond its largest budget
    md = equal_time_markdown(aggs)
    assert "| 70.0 | 0.70 | - | - | 0.850 / 0.425 |" in md
    assert "| 20.0 | 0.20 | - | 0.400 / 0.200 | - |" in md


def test_report_warns_when_runs_come_from_different_machines():
    def row(run, cpu):
        return {"run": run, "machine": {"cpu": cpu, "cores": 2, "gpu": "", "torch": "2.13.0"}}

    assert machines_note([row("full-s0", "A"), row("random-b0.3-s0", "A"), {"run": "old-s0"}]) == ""
    note = machines_note([row("full-s0", "A"), row("random-b0.3-s0", "B")])
    assert "2 kinds of machine" in note and "cpu A" in note and "cpu B" in note and "random-b0.3-s0" in note


def test_tiny_experiment_end_to_end(tmp_path, caplog):
    p = tiny_params(tmp_path)
    p["experiment"] = {"methods": ["full", "cluster", "infobatch"], "budgets": [0.5], "seeds": [0],
                       "results_dir": str(tmp_path / "kept")}
    p["evaluate"]["every"] = 0.5
    params = str(write_params(tmp_path, p))
    summary = run_experiment(params, progress=False)
    res = json.loads((tmp_path / "artifacts/experiments/results.json").read_text())
    assert {r["run"] for r in res["runs"]} == {"full-s0", "cluster-b0.5-s0", "infobatch-s0"}
    aggs = {a["method"]: a for a in summary["aggregate"]}
    assert aggs["cluster"]["kept_fraction"] == 0.5 and aggs["cluster"]["seeds"] == 1
    art = tmp_path / "artifacts"

    def secs(*files):
        return sum(json.loads((art / f).read_text())["wall_clock_s"] for f in files)

    shared = secs("warmup/metrics.json", "features/metrics.json", "cluster/metrics.json")
    own = {r: secs(f"experiments/{r}/select_metrics.json", f"experiments/{r}/allocate_metrics.json")
           for r in ("full-s0", "cluster-b0.5-s0")}
    runs = {r["run"]: r for r in res["runs"]}  # cluster pays the shared selection stages, full does not
    assert runs["full-s0"]["machine"]["cores"] >= 1 and runs["full-s0"]["machine"]["torch"]
    assert runs["cluster-b0.5-s0"]["selection_s"] == pytest.approx(shared + own["cluster-b0.5-s0"])
    assert runs["full-s0"]["selection_s"] == pytest.approx(own["full-s0"]) and shared > 0
    assert aggs["full"]["trained_fraction"] == 1.0 and aggs["cluster"]["trained_fraction"] == 0.5
    assert (tmp_path / "artifacts/experiments/report.png").stat().st_size > 1000
    md = (tmp_path / "artifacts/experiments/report.md").read_text()
    assert "| cluster | 0.5 | 1 |" in md
    full_curve = runs["full-s0"]["curve"]  # the grid's curves: time to target, full data stopped early
    assert len(full_curve) == 2 and full_curve[-1]["end_to_end_s"] <= runs["full-s0"]["end_to_end_s"]
    assert "time to target" in md and "full data stopped at this time" in md and "(curves.png)" in md
    target = full_curve[-1]["val_macro_em"] - 0.01
    cluster = runs["cluster-b0.5-s0"]
    reached = next((c["end_to_end_s"] for c in cluster["curve"] if c["val_macro_em"] >= target - 1e-9), None)
    row = next(line for line in md.splitlines() if line.startswith("| cluster | 0.5 | 1 | ") and "stopped" not in line
               and line.count("|") == 8)
    assert (f"{reached:.1f} (" in row) if reached is not None else "not reached (0 of 1 seeds)" in row
    from clusterft.realdata import run_properties  # what a real profile's script prints of its grid

    props = run_properties(params)
    assert props["full_curve"][-1]["val_macro_em"] == pytest.approx(full_curve[-1]["val_macro_em"], abs=1e-4)
    assert props["full_saturated"] is not None and props["full_saturation_step"] <= props["full_steps"]
    assert set(props["full_val_em_per_skill"]) and props["zero_shot_macro_em"] >= 0
    mtime = (tmp_path / "artifacts/experiments/full-s0/eval.json").stat().st_mtime
    shared_mtime = (tmp_path / "artifacts/features/features.npy").stat().st_mtime
    run_experiment(params, progress=False)  # finished runs are reused, not retrained
    assert (tmp_path / "artifacts/experiments/full-s0/eval.json").stat().st_mtime == mtime
    assert (tmp_path / "artifacts/features/features.npy").stat().st_mtime == shared_mtime  # nor shared stages
    # experiment.results_dir kept each run's result files (no weights); a machine whose artifacts
    # lack the runs reports them from there and does not train them again
    assert sorted(f.name for f in (tmp_path / "kept/cluster-b0.5-s0").iterdir()) == sorted(
        ["digest.txt", "params.json", "shared_times.json", "select_metrics.json", "allocate_metrics.json",
         "train_metrics.json", "eval.json"])
    before = json.loads((tmp_path / "artifacts/experiments/results.json").read_text())["runs"]
    shutil.rmtree(tmp_path / "artifacts/experiments")
    shutil.rmtree(tmp_path / "artifacts/cluster")  # their selection seconds were kept with the runs
    run_experiment(params, report_only=True)
    again = json.loads((tmp_path / "artifacts/experiments/results.json").read_text())["runs"]
    assert json.dumps(again, sort_keys=True) == json.dumps(before, sort_keys=True)
    assert not (tmp_path / "artifacts/experiments/full-s0").exists()  # the report reads kept runs in place
    (tmp_path / "kept/infobatch-s0/train_metrics.json").unlink()  # a kept run missing a file is not whole
    part = run_experiment(params, report_only=True)
    assert {a["method"] for a in part["aggregate"]} == {"full", "cluster"}
    (tmp_path / "kept/infobatch-s0/train_metrics.json").write_text(
        (tmp_path / "kept/full-s0/train_metrics.json").read_text())  # whole again (its figures aside)
    run_experiment(params, progress=False)  # restored into the run folders, not trained again
    assert (tmp_path / "artifacts/experiments/full-s0/eval.json").exists()
    assert not (tmp_path / "artifacts/experiments/full-s0/model").exists()
    assert "Zero-shot base model" in md and json.loads(
        (tmp_path / "artifacts/baseline/eval.json").read_text())["method"] == "zero_shot"
    features = (tmp_path / "artifacts/features/features.npy").stat().st_mtime
    with caplog.at_level(logging.WARNING, logger="clusterft.orchestration.experiment"):
        run_experiment(params, ["train.lr=0.001"], progress=False)  # a changed param: stale runs rerun
    assert (tmp_path / "artifacts/experiments/full-s0/eval.json").stat().st_mtime > mtime
    assert "full-s0: replacing a run kept under other params or data" in caplog.text  # kept ones, said
    assert (tmp_path / "artifacts/features/features.npy").stat().st_mtime == features  # shared: same
    run_experiment(params, ["train.lr=0.001", "cluster.k=3"], progress=False)
    assert (tmp_path / "artifacts/features/features.npy").stat().st_mtime > features
    part = run_experiment(params, ["train.lr=0.001", "cluster.k=3", "experiment.seeds=[0, 5]"],
                          report_only=True)  # seed 5 never ran: reported without it, not trained
    assert {a["seeds"] for a in part["aggregate"]} == {1}
    assert not (tmp_path / "artifacts/experiments/full-s5").exists()


def test_time_budgets_are_their_own_series_but_pool_at_equal_time():
    specs = grid(["full", "random", "cluster_paper"], [0.3], [0], [0.4])
    assert [s.name for s in specs] == ["full-s0", "random-b0.3-s0", "random-t0.4-s0", "cluster_paper-b0.3-s0"]
    assert "select.time_budget=0.4" in specs[2].overrides() and specs[2].label == "random-t0.4"
    assert RunSpec("random", None, 0, 1e6).name == "random-t1000000-s0"  # a valid run folder name

    def agg(method, base, t, em):
        return {"method": method, "base_method": base, "end_to_end_s": t, "macro_em": em}

    aggs = [agg("cluster", "cluster", 20.0, 0.4), agg("cluster-t0.5", "cluster", 60.0, 0.8)]
    assert at_equal_time(aggs, 50.0, "macro_em")["cluster"] == (0.7, True)
