"""Experiment grid: methods x budgets x seeds, each a full select -> allocate -> train ->
evaluate run in experiments/<run>/, then one report (markdown + PNG + MLflow).

The selection stages every cluster-based run needs (warmup, features, cluster) are run
once and their wall-clock is added to each such run's end-to-end time, as a user would pay
it once per dataset. `full` and `infobatch` ignore the budget; `cluster_paper` uses the
budget as the paper's ratio r (its kept fraction then follows the smallest cluster).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clusterft.methods import METHODS, paid_stages, time_budgeted
from clusterft.stages import STAGES, shared_times


@dataclass(frozen=True)
class RunSpec:
    method: str
    budget: float | None
    seed: int
    time_budget: float | None = None  # select.time_budget: the data budget is planned from it

    @property
    def label(self) -> str:
        """The method as the report groups it: a time-budgeted run is its own series."""
        return self.method if self.time_budget is None else f"{self.method}-t{self.time_budget:.10g}"

    @property
    def name(self) -> str:
        b = "" if self.budget is None else f"-b{self.budget:g}"
        t = "" if self.time_budget is None else f"-t{self.time_budget:.10g}"
        return f"{self.method}{b}{t}-s{self.seed}"

    def overrides(self) -> list[str]:
        out = [f"select.seed={self.seed}", f"train.seed={self.seed}",
               f"select.time_budget={self.time_budget or 0}"]
        key = METHODS[self.method].budget
        if key is not None and self.budget is not None:
            out.append(f"{key}={self.budget}")
        return out


def grid(methods: list[str], budgets: list[float], seeds: list[int],
         time_budgets: list[float] = ()) -> list[RunSpec]:
    """Every (method, budget, seed); budget-free methods once per seed; every method a time
    budget can plan (time_budgeted) once more per time budget. Seed-major order so an
    interrupted grid still holds whole seeds."""
    return [
        spec
        for s in seeds
        for m in methods
        for spec in ([RunSpec(m, b, s) for b in ([None] if METHODS[m].budget is None else budgets)]
                     + [RunSpec(m, None, s, tb) for tb in time_budgets if time_budgeted(m, tb)])
    ]


SHARED_SECTIONS = ("data", "model", "lora", "warmup", "features", "cluster")
RUN_SECTIONS = (*SHARED_SECTIONS, "select", "train", "evaluate")


TIME_BUDGET_KEYS = ("select.time_budget", "select.probe_steps")


def params_digest(cfg: Any, sections: tuple[str, ...], omit: tuple[str, ...] = ()) -> str:
    """Hash of the effective params of `sections` (less the `omit` keys) and of the data
    files they name: equal digests mean a stored result was made from the same inputs."""
    import hashlib

    from clusterft.config import to_dict

    doc = {s: to_dict(getattr(cfg, s)) for s in sections}
    for key in omit:
        section, name = key.split(".")
        doc.get(section, {}).pop(name, None)
    h = hashlib.sha1(json.dumps(doc, sort_keys=True).encode())
    for split in ("train", "validation", "test"):
        p = Path(getattr(cfg.data, split))
        h.update(p.read_bytes() if p.exists() else b"-")
    return h.hexdigest()


def run_digest(cfg: Any, spec: RunSpec) -> str:
    """A run's digest: its params and data, and for a time-budgeted run the probe's timings
    its data budget was planned from (a new probe reruns it). Without a time budget its
    params are left out, so runs made before they existed stay valid."""
    digest = params_digest(cfg, RUN_SECTIONS, () if spec.time_budget else TIME_BUDGET_KEYS)
    probe = cfg.artifact("probe", "metrics.json")
    if spec.time_budget and probe.exists():
        import hashlib

        digest = hashlib.sha1(digest.encode() + probe.read_bytes()).hexdigest()
    return digest


def _fresh(stamp: Path, digest: str, done: Path) -> bool:
    """True when `done` exists and `stamp` says it was made under `digest`."""
    return done.exists() and stamp.exists() and stamp.read_text().strip() == digest


def run_one(params: str, overrides: list[str], spec: RunSpec) -> dict[str, Any]:
    """Select, allocate, train (torchrun) and evaluate one run; return its result row.
    A finished run is reused only when its params and data digest match (the grid resumes
    after a crash; a changed param reruns the runs it affects)."""
    from clusterft.artifacts import atomic_write_text
    from clusterft.config import load_config
    from clusterft.distributed import launch_stage

    cfg = load_config(params, [*overrides, *spec.overrides()])
    rdir = cfg.method_dir(spec.method, spec.name)
    digest = run_digest(cfg, spec)
    if not _fresh(rdir / "digest.txt", digest, rdir / "eval.json"):
        if rdir.exists():
            import shutil

            shutil.rmtree(rdir)  # stale: made under other params (its checkpoints too)
        for st in STAGES:
            if st.per_method and st.workers:
                launch_stage(cfg, st.name, params, [*overrides, *spec.overrides()], spec.method, spec.name)
            elif st.per_method:
                st.function(cfg, spec.method, spec.name)
        from clusterft.tracking import run_params

        atomic_write_text(rdir / "params.json", json.dumps(run_params(cfg), indent=1))
        atomic_write_text(rdir / "digest.txt", digest)
    return result_row(cfg, spec, rdir)


def finished_row(params: str, overrides: list[str], spec: RunSpec) -> dict[str, Any] | None:
    """The result row of a run finished under the current params, else None."""
    from clusterft.config import load_config

    cfg = load_config(params, [*overrides, *spec.overrides()])
    rdir = cfg.method_dir(spec.method, spec.name)
    if not _fresh(rdir / "digest.txt", run_digest(cfg, spec), rdir / "eval.json"):
        return None
    return result_row(cfg, spec, rdir)


def result_row(cfg: Any, spec: RunSpec, rdir: Path) -> dict[str, Any]:
    sel = json.loads((rdir / "select_metrics.json").read_text())
    alloc = json.loads((rdir / "allocate_metrics.json").read_text())
    tr = json.loads((rdir / "train_metrics.json").read_text())
    ev = json.loads((rdir / "eval.json").read_text())
    shared = shared_times(cfg)
    pre = sum(shared[s] for s in paid_stages(spec.method, cfg.select.time_budget))
    trained = sum(tr.get("samples_trained_per_epoch") or [0])
    planned = sel.get("time_plan", {}).get("planned_end_to_end_s", float("nan"))
    return {
        "run": spec.name, "method": spec.label, "base_method": spec.method, "budget": spec.budget,
        "seed": spec.seed,
        "time_budget": spec.time_budget, "planned_end_to_end_s": planned,
        "kept_fraction": sel["kept_fraction"],
        "kept_distinct": sel.get("kept_distinct", float("nan")),
        "plan_drift": alloc.get("prefix_discrepancy_max", float("nan")),
        "trained_fraction": trained / (sel["n_train"] * cfg.train.epochs),
        "selection_s": pre + sel["wall_clock_s"] + alloc["wall_clock_s"],
        "train_s": tr["wall_clock_s"],
        "end_to_end_s": pre + sel["wall_clock_s"] + alloc["wall_clock_s"] + tr["wall_clock_s"],
        "macro_em": ev["macro_exact_match"], "worst_skill_em": ev["worst_skill_exact_match"],
        "worst_skill": ev["worst_skill"], "heldout_loss": ev["heldout_loss"],
        "heldout_loss_open_ended": ev.get("heldout_loss_open_ended", float("nan")),
        "val_macro_em": ev.get("validation", {}).get("macro_exact_match", float("nan")),
        "val_worst_skill_em": ev.get("validation", {}).get("worst_skill_exact_match", float("nan")),
    }


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and spread (std over seeds) per (method, budget); time relative to full."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["budget"]), []).append(r)
    full_train = np.mean([r["train_s"] for r in rows if r["method"] == "full"] or [np.nan])
    out = []
    for (method, budget), rs in groups.items():
        agg: dict[str, Any] = {"method": method, "base_method": rs[0].get("base_method", method),
                               "budget": budget, "seeds": len(rs)}
        for k in ("kept_fraction", "kept_distinct", "plan_drift", "trained_fraction", "selection_s", "train_s", "end_to_end_s",
                  "macro_em", "worst_skill_em", "heldout_loss", "heldout_loss_open_ended",
                  "val_macro_em", "val_worst_skill_em", "planned_end_to_end_s"):
            v = np.array([r.get(k, np.nan) for r in rs], dtype=float)
            agg[k], agg[f"{k}_std"] = float(v.mean()), float(v.std())
        agg["time_vs_full_train"] = agg["end_to_end_s"] / full_train
        out.append(agg)
    return sorted(out, key=lambda a: (a["method"] != "full", a["method"], a["budget"] or 0))


def markdown(aggs: list[dict[str, Any]]) -> str:
    lines = [
        "| method | budget | seeds | kept (distinct) | plan drift | trained (sample-epochs) | selection s | train s "
        "| end-to-end s | planned s | end-to-end / full train | macro EM | worst-skill EM | held-out loss "
        "| open-ended loss | validation macro / worst |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in aggs:
        b = "-" if a["budget"] is None else f"{a['budget']:g}"
        planned = "-" if np.isnan(a["planned_end_to_end_s"]) else f"{a['planned_end_to_end_s']:.1f}"
        lines.append(
            f"| {a['method']} | {b} | {a['seeds']} | {a['kept_fraction']:.1%} ({a['kept_distinct']:.0f}) "
            f"| {a['plan_drift']:.1f} | {a['trained_fraction']:.1%} "
            f"| {a['selection_s']:.1f} | {a['train_s']:.1f} ± {a['train_s_std']:.1f} "
            f"| {a['end_to_end_s']:.1f} | {planned} | {a['time_vs_full_train']:.2f} "
            f"| {a['macro_em']:.3f} ± {a['macro_em_std']:.3f} | {a['worst_skill_em']:.3f} ± {a['worst_skill_em_std']:.3f} "
            f"| {a['heldout_loss']:.4f} | {a['heldout_loss_open_ended']:.4f} "
            f"| {a['val_macro_em']:.3f} / {a['val_worst_skill_em']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def _base(a: dict[str, Any]) -> str:
    return a.get("base_method", a["method"])


def at_equal_time(aggs: list[dict[str, Any]], t: float, key: str) -> dict[str, tuple[float, bool] | None]:
    """Per method, its mean `key` at end-to-end time t: (value, interpolated?), linear
    between the method's two points (data or time budgets, pooled) that bracket t; None when
    t is outside its range (no extrapolation). A method measured at one point only counts
    at that point (+-2%)."""
    out: dict[str, tuple[float, bool] | None] = {}
    for method in dict.fromkeys(_base(a) for a in aggs):
        pts = sorted((a["end_to_end_s"], a[key]) for a in aggs if _base(a) == method)
        exact = [v for x, v in pts if abs(x - t) <= 0.02 * t]
        if exact:
            out[method] = (exact[0], False)
            continue
        out[method] = None
        for (x0, v0), (x1, v1) in zip(pts, pts[1:]):
            if x0 < t < x1:
                out[method] = (v0 + (v1 - v0) * (t - x0) / (x1 - x0), True)
    return out


def equal_time_markdown(aggs: list[dict[str, Any]]) -> str:
    """Macro / worst-skill EM of every method at the end-to-end times the budget-free
    methods (InfoBatch, full) and `cluster` were measured at: a comparison at equal wall-clock."""
    full_train = next((a["train_s"] for a in aggs if a["method"] == "full"), None)  # as in aggregate
    times = sorted({round(a["end_to_end_s"], 1) for a in aggs
                    if _base(a) in ("cluster", "cluster_dynamic", "infobatch", "full")})
    methods = list(dict.fromkeys(_base(a) for a in aggs))
    lines = ["| end-to-end s | x full train | " + " | ".join(methods) + " |",
             "|---|---|" + "---|" * len(methods)]
    for t in times:
        macro, worst = at_equal_time(aggs, t, "macro_em"), at_equal_time(aggs, t, "worst_skill_em")
        cells = []
        for m in methods:
            if macro[m] is None:
                cells.append("-")
            else:
                mark = " (interp.)" if macro[m][1] else ""
                cells.append(f"{macro[m][0]:.3f} / {worst[m][0]:.3f}{mark}")
        ratio = f"{t / full_train:.2f}" if full_train else "-"
        lines.append(f"| {t:.1f} | {ratio} | " + " | ".join(cells) + " |")
    return ("Macro / worst-skill exact match at equal end-to-end time (seed means; a method's "
            "data-budget and time-budget points pooled; 'interp.' = linear between its two "
            "neighbouring points, '-' = outside the times it was measured at):\n\n" + "\n".join(lines) + "\n")


def plot(aggs: list[dict[str, Any]], path: Path) -> None:
    """End-to-end time vs macro and worst-skill EM (mean +- std over seeds); full = line."""
    from clusterft.plots import _figure, _save

    plt = _figure()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    full = next((a for a in aggs if a["method"] == "full"), None)
    for ax, key, title in ((axes[0], "macro_em", "macro exact match"),
                           (axes[1], "worst_skill_em", "worst-skill exact match")):
        for method in dict.fromkeys(a["method"] for a in aggs):
            pts = [a for a in aggs if a["method"] == method]
            ax.errorbar([a["end_to_end_s"] for a in pts], [a[key] for a in pts],
                        xerr=[a["end_to_end_s_std"] for a in pts], yerr=[a[f"{key}_std"] for a in pts],
                        marker="o", capsize=3, label=method)
            for a in pts:
                if a["budget"] is not None:
                    ax.annotate(f"{a['budget']:g}", (a["end_to_end_s"], a[key]), fontsize=7,
                                xytext=(3, 3), textcoords="offset points")
        if full:
            ax.axhline(full[key], color="grey", ls="--", lw=1)
            ax.axvline(full["end_to_end_s"], color="grey", ls=":", lw=1)
        ax.set_xlabel("end-to-end seconds (selection stages + training)")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)


def write_report(cfg: Any, rows: list[dict[str, Any]], track: bool = True) -> dict[str, Any]:
    """experiments/report.md + report.png + results.json; an MLflow parent run with one
    nested run per grid run."""
    from clusterft.artifacts import atomic_write_text, write_json

    out = cfg.artifact("experiments")
    aggs = aggregate(rows)
    table = markdown(aggs)
    plot(aggs, out / "report.png")
    zs = zero_shot(cfg)
    floor = ("" if zs is None else
             f"Zero-shot base model (no fine-tuning, {zs['split']} split): macro EM "
             f"{zs['macro_exact_match']:.3f}, worst skill {zs['worst_skill_exact_match']:.3f}, "
             f"held-out loss {zs['heldout_loss']:.4f}.\n\n")
    atomic_write_text(out / "report.md", "# clusterft experiment: methods x budgets x seeds\n\n"
                      f"Exact match on the {cfg.evaluate.split} split.\n\n" + floor + table
                      + "\n" + equal_time_markdown(aggs) + "\n![time vs accuracy](report.png)\n")
    write_json(out / "results.json", {"runs": rows, "aggregate": aggs, "zero_shot": zs,
                                      "split": cfg.evaluate.split})
    summary: dict[str, Any] = {"aggregate": aggs}
    if track:
        summary["mlflow_run_id"] = _track(cfg, rows, aggs, [out / "report.md", out / "report.png"])
    print(table)
    return summary


def _track(cfg: Any, rows: list[dict], aggs: list[dict], artifacts: list[Path]) -> str:
    import mlflow

    from clusterft.tracking import _adopt, _numeric, provenance, run_params, use_experiment

    use_experiment(cfg)
    with mlflow.start_run(run_name="experiment", tags={"clusterft.kind": "experiment", **provenance()}) as parent:
        mlflow.log_params(run_params(cfg))
        for r in rows:
            rdir = cfg.method_dir(r["base_method"], r["run"])
            with mlflow.start_run(run_name=r["run"], nested=True) as child:
                p = rdir / "params.json"  # the run's effective params, written by run_one
                mlflow.log_params({**(json.loads(p.read_text()) if p.exists() else {}),
                                   **{k: str(r[k]) for k in ("method", "budget", "seed")}})
                mlflow.log_metrics(_numeric(r))
                live = json.loads((rdir / "train_metrics.json").read_text()).get("mlflow_run_id")
                if live:
                    _adopt(live, child.info.run_id)
        for a in aggs:
            b = "full" if a["budget"] is None else f"{a['budget']:g}"
            mlflow.log_metrics({f"{a['method']}.b{b}.{k}": v for k, v in _numeric(a).items()})
        for p in artifacts:
            mlflow.log_artifact(str(p))
        return parent.info.run_id


def prepare_shared(cfg: Any, params: str, overrides: list[str]) -> None:
    """Run the once-per-dataset stages the grid's methods need, unless already done under
    the same params and data (else all of them again); the training probe (torchrun) when
    a time budget needs it and its last run timed another setup."""
    from clusterft.artifacts import atomic_write_text

    digest = params_digest(cfg, SHARED_SECTIONS)
    stamp = cfg.artifact("shared_digest.txt")  # written once every shared stage is done
    stale = not _fresh(stamp, digest, stamp)
    e = cfg.experiment
    needed = {"prepare-model"} | {s for m in e.methods for tb in (0, *e.time_budgets) for s in paid_stages(m, tb)}
    if cfg.builtin_split("train"):
        needed.add("make-benchmark")
    for st in STAGES:
        if st.name == "probe" and st.name in needed:
            _probe(cfg, params, [*overrides, f"select.time_budget={e.time_budgets[0]}"])
        elif st.name in needed and (stale or not st.metrics_path(cfg).exists()):
            st.function(cfg)
    if cfg.experiment.zero_shot and (stale or not cfg.artifact("baseline", "eval.json").exists()):
        from clusterft.evaluate import run_zero_shot

        run_zero_shot(cfg)  # the floor: the base model before any fine-tuning
    atomic_write_text(stamp, digest)


def check_time_budgets(params: str, overrides: list[str]) -> None:
    """Refuse (TimeBudgetError, with the smallest that fits) a time budget of the grid that no
    run could meet, before any run trains (each run's select would refuse it later)."""
    from clusterft.config import load_config
    from clusterft.data import load_examples
    from clusterft.probe import read_probe
    from clusterft.selection import cluster_count, time_plan, train_chars
    from clusterft.timebudget import TimeModel

    base = load_config(params, overrides)
    if not base.experiment.time_budgets:
        return
    chars, tm = train_chars(load_examples(base, "train")), TimeModel.from_probe(read_probe(base))
    for tb in base.experiment.time_budgets:
        cfg = load_config(params, [*overrides, f"select.time_budget={tb}"])
        for m in base.experiment.methods:
            if time_budgeted(m, tb):
                time_plan(cfg, m, tm, chars, cluster_count(cfg) if "cluster" in METHODS[m].needs else 0, 0.0)


def _probe(cfg: Any, params: str, overrides: list[str]) -> None:
    """Run the probe stage (torchrun) unless it already timed this training setup."""
    from clusterft.config import load_config
    from clusterft.distributed import launch_stage
    from clusterft.probe import read_probe
    from clusterft.selection import SelectionError

    on = load_config(params, overrides)
    try:
        read_probe(on)
    except SelectionError:
        launch_stage(on, "probe", params, overrides)


def zero_shot(cfg: Any) -> dict[str, Any] | None:
    """The base model's scores (baseline/eval.json), when measured."""
    p = cfg.artifact("baseline", "eval.json")
    return json.loads(p.read_text()) if p.exists() else None


def run_experiment(params: str, overrides: list[str] | None = None, progress: bool = True,
                   report_only: bool = False) -> dict[str, Any]:
    """Stage `experiment`: shared stages once (if missing), every grid run, the report.
    `report_only`: no training; the report covers the grid's runs already finished under the
    current params (e.g. a grid stopped part-way)."""
    from tqdm import tqdm

    from clusterft.config import load_config

    overrides = list(overrides or [])
    cfg = load_config(params, overrides)
    e = cfg.experiment
    specs = grid(e.methods, e.budgets, e.seeds, e.time_budgets)
    if report_only:
        rows = [r for r in (finished_row(params, overrides, s) for s in specs) if r is not None]
        return write_report(cfg, rows)
    prepare_shared(cfg, params, overrides)
    check_time_budgets(params, overrides)
    rows = []
    start = time.perf_counter()
    bar = tqdm(specs, desc="experiment", unit="run", disable=not progress)
    for spec in bar:
        bar.set_postfix_str(spec.name)
        rows.append(run_one(params, overrides, spec))
    summary = write_report(cfg, rows)
    summary["wall_clock_s"] = time.perf_counter() - start
    return summary
