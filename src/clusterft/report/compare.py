"""The methods compared: wall-clock of every stage, end-to-end time, saving versus full, accuracy.

End-to-end time of a method = the selection stages it needs (`needs` in the method table:
warmup + features + cluster for `cluster`) + select + allocate + train. Building the data
and the model, and evaluation, cost the same for every method and are shown apart.
"""

from __future__ import annotations

from typing import Any

from clusterft.spec.methods import paid_stages
from clusterft.spec.stages import STAGES

SHARED_STAGES = tuple(s.name for s in STAGES if s.selection)  # warmup, features, cluster, probe


def summarise(collected: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per method with stage times, end-to-end seconds, saving and accuracy."""
    shared = collected["shared"]
    rows = []
    for method, st in collected["methods"].items():
        row: dict[str, Any] = {"method": method}
        paid = paid_stages(method, collected.get("time_budget", 0.0))
        for s in SHARED_STAGES:
            needed = s in paid
            row[f"{s}_s"] = shared.get(s, {}).get("wall_clock_s", 0.0) if needed else 0.0
        for s in ("select", "allocate", "train"):
            row[f"{s}_s"] = st.get(s, {}).get("wall_clock_s", float("nan"))
        row["end_to_end_s"] = sum(row[f"{s}_s"] for s in (*SHARED_STAGES, "select", "allocate", "train"))
        row["kept_fraction"] = st.get("select", {}).get("kept_fraction", float("nan"))
        row["kept_distinct"] = st.get("select", {}).get("kept_distinct", float("nan"))
        row["plan_drift"] = st.get("allocate", {}).get("prefix_discrepancy_max", float("nan"))
        row["planned_end_to_end_s"] = st.get("select", {}).get("time_plan", {}).get("planned_end_to_end_s",
                                                                                    float("nan"))
        row["truncated_fraction"] = st.get("train", {}).get("truncation", {}).get("truncated_fraction", float("nan"))
        ev = st.get("evaluate", {})
        row["macro_em"] = ev.get("macro_exact_match", float("nan"))
        row["worst_skill_em"] = ev.get("worst_skill_exact_match", float("nan"))
        row["worst_skill"] = ev.get("worst_skill", "")
        row["heldout_loss"] = ev.get("heldout_loss", float("nan"))
        rows.append(row)
    full = next((r for r in rows if r["method"] == "full"), None)
    for r in rows:
        if full:
            r["time_vs_full"] = r["end_to_end_s"] / full["train_s"]
            r["saving_vs_full_pct"] = 100.0 * (1 - r["end_to_end_s"] / full["end_to_end_s"])
            r["macro_em_delta_pts"] = 100.0 * (r["macro_em"] - full["macro_em"])
        else:
            r["time_vs_full"] = r["saving_vs_full_pct"] = r["macro_em_delta_pts"] = float("nan")
    return rows


def _planned(row: dict[str, Any]) -> str:
    p = row["planned_end_to_end_s"]
    return "-" if p != p else f"{p:.1f}"  # NaN: no time budget


def markdown_table(rows: list[dict[str, Any]]) -> str:
    head = ("| method | kept (distinct) | plan drift | warmup s | features s | cluster s | probe s | select s | allocate s | train s "
            "| end-to-end s | planned s | saving vs full | macro EM | Δ macro (pts) | worst skill EM | held-out loss "
            "| truncated |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['kept_fraction']:.1%} ({r['kept_distinct']:.0f}) | {r['plan_drift']:.1f} "
            f"| {r['warmup_s']:.1f} | {r['features_s']:.1f} "
            f"| {r['cluster_s']:.1f} | {r['probe_s']:.1f} | {r['select_s']:.1f} | {r['allocate_s']:.1f} "
            f"| {r['train_s']:.1f} | {r['end_to_end_s']:.1f} | {_planned(r)} "
            f"| {r['saving_vs_full_pct']:.1f}% | {r['macro_em']:.3f} "
            f"| {r['macro_em_delta_pts']:+.1f} | {r['worst_skill_em']:.3f} ({r['worst_skill']}) "
            f"| {r['heldout_loss']:.4f} | {r['truncated_fraction']:.1%} |"
        )
    return "\n".join(lines) + "\n"
