"""Plan order on the same selections: `balanced` (every cluster spread over every stretch
of steps) against `per_step` (balanced inside each step only: small clusters in blocks)
and `shuffle` (a random order), side by side with `random` subsets and full data.

    .venv/bin/python benchmarks/plan_order.py --params profiles/smollm2.yaml \
        --methods cluster --budgets 0.3 --seeds 0 1 2 --modes balanced per_step
    .venv/bin/python benchmarks/plan_order.py --params profiles/smollm2.yaml --report-only \
        --methods cluster cluster_dynamic --budgets 0.2 0.3 0.5 --seeds 0 1 2

Each mode is an experiment grid (`train.allocation=<mode>`) in its own artifacts folder
(<artifacts>-<mode>; `balanced`, the default, in <artifacts> itself, beside the reference
methods). The selection stages are deterministic, so every mode trains the same selection
(checked: the script compares the selection files run by run). Finished runs are reused
(run digests), so the script can be called again with more seeds or budgets; with
`--report-only` it trains nothing and prints every finished run of the grid it is given.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any


def mode_overrides(params: str, overrides: list[str], mode: str) -> list[str]:
    """Overrides that put `mode`'s grid in its own artifacts folder (built-in data and
    model move with it)."""
    from clusterft.spec.config import load_config, relocate

    if mode == "balanced":
        return [*overrides, "train.allocation=balanced"]
    cfg = load_config(params, overrides)
    root = f"{cfg.paths.artifacts}-{mode}"
    moved = relocate(root) if cfg.builtin_split("train") else [f"paths.artifacts={root}"]
    return [*overrides, *moved, f"train.allocation={mode}", "experiment.zero_shot=false"]


def grid_overrides(methods: list[str], budgets: list[float], seeds: list[int]) -> list[str]:
    return [f"experiment.methods=[{', '.join(methods)}]", f"experiment.budgets=[{', '.join(map(str, budgets))}]",
            f"experiment.seeds=[{', '.join(map(str, seeds))}]", "experiment.time_budgets=[]"]


def aggregates(params: str, overrides: list[str], train: bool) -> tuple[list[dict], list[dict]]:
    """(runs, aggregates) of one grid: trained (missing runs) or only reported."""
    from clusterft.orchestration.experiment import finished_row, run_experiment
    from clusterft.report.grid import aggregate
    from clusterft.spec.config import load_config
    from clusterft.spec.grid import grid

    if train:
        run_experiment(params, overrides, progress=True)
    e = load_config(params, overrides).experiment
    rows = [r for r in (finished_row(params, overrides, s) for s in grid(e.methods, e.budgets, e.seeds)) if r]
    return rows, aggregate(rows)


def same_selections(params: str, per_mode: dict[str, list[str]], runs: dict[str, list[dict]]) -> list[str]:
    """Run names whose selection.jsonl differs between modes (should be none)."""
    from clusterft.spec.config import load_config

    texts: dict[str, set[bytes]] = {}
    for mode, ov in per_mode.items():
        cfg = load_config(params, ov)
        for r in runs[mode]:
            texts.setdefault(r["run"], set()).add(
                (cfg.method_dir(r["base_method"], r["run"]) / "selection.jsonl").read_bytes())
    return sorted(name for name, t in texts.items() if len(t) > 1)


def _cells(a: dict[str, Any]) -> str:
    b = "-" if a["budget"] is None else f"{a['budget']:g}"
    return (f"{a['method']} | {b} | {a['seeds']} | {a['plan_drift']:.1f} | {a['train_s']:.1f} "
            f"| {a['end_to_end_s']:.1f} | {a['macro_em']:.3f} ± {a['macro_em_std']:.3f} "
            f"| {a['worst_skill_em']:.3f} ± {a['worst_skill_em_std']:.3f} "
            f"| {a['heldout_loss']:.4f} ± {a['heldout_loss_std']:.4f} "
            f"| {a['val_macro_em']:.3f} ± {a['val_macro_em_std']:.3f} / {a['val_worst_skill_em']:.3f}")


def table(per_mode: dict[str, list[dict]], reference: list[dict]) -> str:
    """Markdown: one row per (mode, method, budget), with random at the same end-to-end time
    (linear between random's budgets; '-' outside them), then the reference runs."""
    from clusterft.report.grid import at_equal_time

    head = ("| plan | method | budget | seeds | plan drift | train s | end-to-end s | macro EM | worst-skill EM "
            "| held-out loss | validation macro / worst | random at equal time | vs random |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for mode, aggs in per_mode.items():
        for a in aggs:
            ref = at_equal_time([*reference, a], a["end_to_end_s"], "macro_em").get("random")
            rnd = "-" if ref is None else f"{ref[0]:.3f}" + (" (interp.)" if ref[1] else "")
            gap = "-" if ref is None else f"{100 * (a['macro_em'] - ref[0]):+.1f}"
            lines.append(f"| {mode} | {_cells(a)} | {rnd} | {gap} |")
    lines += [f"| - | {_cells(a)} | - | - |" for a in reference]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--modes", nargs="+", default=["balanced", "per_step", "shuffle"])
    ap.add_argument("--methods", nargs="+", default=["cluster"])
    ap.add_argument("--budgets", nargs="+", type=float, default=[0.3])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--reference", nargs="*", default=["full", "random"],
                    help="methods run once (in the balanced folder) as the bars: full, random")
    ap.add_argument("--reference-budgets", nargs="+", type=float, default=[0.2, 0.3, 0.5])
    ap.add_argument("--reference-seeds", nargs="+", type=int, default=None, help="default: --seeds")
    ap.add_argument("--report-only", action="store_true", help="train nothing; report finished runs")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    train = not args.report_only
    ref_seeds = args.seeds if args.reference_seeds is None else args.reference_seeds
    ref_ov = [*args.overrides, *grid_overrides(args.reference, args.reference_budgets, ref_seeds)]
    reference = aggregates(args.params, ref_ov, train)[1] if args.reference else []
    per_mode, runs, aggs = {}, {}, {}
    for mode in args.modes:
        per_mode[mode] = [*mode_overrides(args.params, args.overrides, mode),
                          *grid_overrides(args.methods, args.budgets, args.seeds)]
        runs[mode], aggs[mode] = aggregates(args.params, per_mode[mode], train)
    print(table(aggs, reference))
    differ = same_selections(args.params, per_mode, runs)
    print("selections identical across plans:", "yes" if not differ else f"NO: {', '.join(differ)}")


if __name__ == "__main__":
    main()
