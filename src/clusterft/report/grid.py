"""The experiment grid's report: one row per run from its metrics files, mean and spread
over seeds, accuracy at equal end-to-end time, the time-vs-accuracy plot, results.json and
the MLflow parent run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from clusterft.core.curves import TARGET_MARGIN, saturated, saturation_step, time_to_target, value_at
from clusterft.io.artifacts import atomic_write_text, read_json, write_json
from clusterft.io.timings import shared_times
from clusterft.report.plots import figure, save_figure
from clusterft.report.tracking import log_experiment
from clusterft.spec.grid import RunSpec
from clusterft.spec.methods import paid_stages


def result_row(cfg: Any, spec: RunSpec, rdir: Path) -> dict[str, Any]:
    """One finished run's figures, read from its stages' metrics: kept, plan drift, stage
    seconds (the paid selection stages included), scores on test and validation."""
    sel, alloc = read_json(rdir / "select_metrics.json"), read_json(rdir / "allocate_metrics.json")
    tr, ev = read_json(rdir / "train_metrics.json"), read_json(rdir / "eval.json")
    shared = shared_times(cfg, rdir)
    pre = sum(shared[s] for s in paid_stages(spec.method, cfg.select.time_budget))
    trained = sum(tr.get("samples_trained_per_epoch") or [0])
    planned = sel.get("time_plan", {}).get("planned_end_to_end_s", float("nan"))
    selection_s = pre + sel["wall_clock_s"] + alloc["wall_clock_s"]
    return {
        "run": spec.name, "method": spec.label, "base_method": spec.method, "budget": spec.budget,
        "seed": spec.seed,
        "time_budget": spec.time_budget, "planned_end_to_end_s": planned,
        "kept_fraction": sel["kept_fraction"],
        "kept_distinct": sel.get("kept_distinct", float("nan")),
        "plan_drift": alloc.get("prefix_discrepancy_max", float("nan")),
        "trained_fraction": trained / (sel["n_train"] * cfg.train.epochs),
        "selection_s": selection_s,
        "train_s": tr["wall_clock_s"],
        "end_to_end_s": selection_s + tr["wall_clock_s"],
        "macro_em": ev["macro_exact_match"], "worst_skill_em": ev["worst_skill_exact_match"],
        "worst_skill": ev["worst_skill"], "heldout_loss": ev["heldout_loss"],
        "heldout_loss_open_ended": ev.get("heldout_loss_open_ended", float("nan")),
        "val_macro_em": ev.get("validation", {}).get("macro_exact_match", float("nan")),
        "val_worst_skill_em": ev.get("validation", {}).get("worst_skill_exact_match", float("nan")),
        "steps": tr.get("steps"), "eval_during_train_s": tr.get("eval_during_train_s", 0.0),
        "machine": tr.get("machine", {}),
        "curve": [{"step": p["step"], "end_to_end_s": selection_s + p["train_s"], "val_macro_em": p["val_macro_em"]}
                  for p in tr.get("curve", [])],
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


def _mean_curve(runs: list[dict[str, Any]]) -> list[tuple[float, float, int]]:
    """(end-to-end s, validation macro EM, step) of the seeds' curves averaged point by point
    (a method's seeds share their evaluation steps)."""
    curves = [r["curve"] for r in runs if r.get("curve")]
    n = min((len(c) for c in curves), default=0)
    return [(float(np.mean([c[i]["end_to_end_s"] for c in curves])), float(np.mean([c[i]["val_macro_em"] for c in curves])),
             curves[0][i]["step"]) for i in range(n)]


def curves_markdown(rows: list[dict[str, Any]], aggs: list[dict[str, Any]]) -> str:
    """With evaluate.every: each method's time to target (its validation curve first at full
    data's final validation macro EM minus 1 point, selection stages included), full data
    stopped at each method's end-to-end time (read off full data's own curve), whether full
    data had saturated, and what the evaluation cost. Empty without curves."""
    full_runs = [r for r in rows if r["method"] == "full" and r.get("curve")]
    if not full_runs:
        return ""
    full = _mean_curve(full_runs)
    target = full[-1][1] - TARGET_MARGIN
    full_train = next((a["train_s"] for a in aggs if a["method"] == "full"), float("nan"))
    total = full_runs[0]["steps"] or full[-1][2]
    sat = saturated([(s, v) for _, v, s in full], total)
    lines = ["| method | budget | seeds | end-to-end s | validation macro EM | full data stopped at this time "
             "| time to target s (x full train) |", "|---|---|---|---|---|---|---|"]
    for a in aggs:
        runs = [r for r in rows if r["method"] == a["method"] and r["budget"] == a["budget"] and r.get("curve")]
        if not runs:
            continue
        hits = [time_to_target([(p["end_to_end_s"], p["val_macro_em"]) for p in r["curve"]], target) for r in runs]
        reached = [h for h in hits if h is not None]
        ttt = (f"{np.mean(reached):.1f} ({np.mean(reached) / full_train:.2f})" if len(reached) == len(hits)
               else f"not reached ({len(reached)} of {len(hits)} seeds)")
        stopped = value_at([(t, v) for t, v, _ in full], a["end_to_end_s"])
        b = "-" if a["budget"] is None else f"{a['budget']:g}"
        lines.append(f"| {a['method']} | {b} | {a['seeds']} | {a['end_to_end_s']:.1f} | {a['val_macro_em']:.3f} "
                     f"| {'-' if stopped is None else f'{stopped:.3f}'} | {ttt} |")
    step = saturation_step([(s, v) for _, v, s in full])
    verdict = (f"full data saturated: within {TARGET_MARGIN * 100:.0f} point of its final validation macro EM "
               f"({full[-1][1]:.3f}) from step {step} of {total}" if sat else
               "**full data had not saturated** (still improving after half its steps): a subset cannot "
               "match it in a fraction of the steps" if sat is False else "full data's curve has one point")
    cost = [r["eval_during_train_s"] / r["train_s"] for r in rows if r.get("curve") and r["train_s"]]
    return (f"Validation curves (evaluate.every): time to target = end-to-end time (selection stages "
            f"included) at which a run's validation macro EM first reaches full data's final value minus "
            f"{TARGET_MARGIN * 100:.0f} point ({target:.3f}), seed mean; full data stopped at this time = full "
            f"data's own validation curve read at the method's end-to-end time (the baseline of training "
            f"less). {verdict}. Evaluation during training cost {np.mean(cost):.0%} of training time on "
            f"average (not counted in it).\n\n" + "\n".join(lines) + "\n")


def plot_curves(rows: list[dict[str, Any]], path: Path) -> bool:
    """Validation macro EM against end-to-end time, one line per run (full data bold); False
    (nothing drawn) without curves."""
    runs = [r for r in rows if r.get("curve")]
    if not runs:
        return False
    plt = figure()
    fig, ax = plt.subplots(figsize=(7, 4))
    colours: dict[str, Any] = {}
    for r in runs:
        xs, ys = [p["end_to_end_s"] for p in r["curve"]], [p["val_macro_em"] for p in r["curve"]]
        first = r["method"] not in colours
        line, = ax.plot(xs, ys, marker=".", lw=2.5 if r["method"] == "full" else 1,
                        color=colours.get(r["method"]), label=r["method"] if first else None)
        colours.setdefault(r["method"], line.get_color())
    ax.set_xlabel("end-to-end seconds (selection stages + training, evaluation excluded)")
    ax.set_ylabel("validation macro exact match")
    ax.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)
    return True


def plot(aggs: list[dict[str, Any]], path: Path) -> None:
    """End-to-end time vs macro and worst-skill EM (mean +- std over seeds); full = line."""
    plt = figure()
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
    save_figure(fig, path)
    plt.close(fig)


def write_report(cfg: Any, rows: list[dict[str, Any]], track: bool = True) -> dict[str, Any]:
    """experiments/report.md + report.png + results.json; an MLflow parent run with one
    nested run per grid run."""
    out = cfg.artifact("experiments")
    aggs = aggregate(rows)
    table = markdown(aggs)
    plot(aggs, out / "report.png")
    zs = zero_shot(cfg)
    floor = ("" if zs is None else
             f"Zero-shot base model (no fine-tuning, {zs['split']} split): macro EM "
             f"{zs['macro_exact_match']:.3f}, worst skill {zs['worst_skill_exact_match']:.3f}, "
             f"held-out loss {zs['heldout_loss']:.4f}.\n\n")
    curves = curves_markdown(rows, aggs)
    if plot_curves(rows, out / "curves.png"):
        curves += "\n![validation curves](curves.png)\n"
    atomic_write_text(out / "report.md", "# clusterft experiment: methods x budgets x seeds\n\n"
                      f"Exact match on the {cfg.evaluate.split} split.\n\n" + machines_note(rows) + floor + table
                      + "\n" + equal_time_markdown(aggs) + "\n![time vs accuracy](report.png)\n"
                      + ("\n" + curves if curves else ""))
    write_json(out / "results.json", {"runs": rows, "aggregate": aggs, "zero_shot": zs,
                                      "split": cfg.evaluate.split})
    summary: dict[str, Any] = {"aggregate": aggs}
    if track:
        summary["mlflow_run_id"] = log_experiment(cfg, rows, aggs, [out / "report.md", out / "report.png"])
    print(table)
    return summary


def machines_note(rows: list[dict[str, Any]]) -> str:
    """A warning when the grid's runs were trained on more than one kind of machine (a grid
    finished over several sessions or machines): their times are not side by side."""
    kinds: dict[str, list[str]] = {}
    for r in rows:
        m = r.get("machine") or {}
        if m:
            kinds.setdefault(", ".join(f"{k} {m[k]}" for k in sorted(m) if m[k]), []).append(r["run"])
    if len(kinds) < 2:
        return ""
    return (f"**The runs were trained on {len(kinds)} kinds of machine**, so their times are not measured side "
            "by side: " + "; ".join(f"{k} ({len(v)} runs: {', '.join(v[:3])}{', ...' if len(v) > 3 else ''})"
                                    for k, v in kinds.items()) + ".\n\n")


def zero_shot(cfg: Any) -> dict[str, Any] | None:
    """The base model's scores (baseline/eval.json), when measured."""
    p = cfg.artifact("baseline", "eval.json")
    return read_json(p) if p.exists() else None
