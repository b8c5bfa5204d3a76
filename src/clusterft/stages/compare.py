"""Stage `compare`: every method's stage times and scores read from their metrics files,
one table (report/compare.md, compare.json) and one MLflow parent run with the stages nested."""

from __future__ import annotations

from typing import Any

from clusterft.io.artifacts import atomic_write_text, read_json, write_json
from clusterft.report.compare import markdown_table, summarise
from clusterft.report.tracking import log_pipeline
from clusterft.spec.stages import STAGES


def collect(cfg: Any) -> dict[str, Any]:
    """Read every stage's metrics JSON: {'shared': {stage: m}, 'methods': {method: {stage: m}}}."""
    shared = {s.name: read_json(s.metrics_path(cfg)) for s in STAGES
              if s.selection and s.metrics_path(cfg).exists()}
    shared = {k: v for k, v in shared.items() if not v.get("skipped")}  # the probe without a time budget
    methods = {}
    for method in cfg.select.methods:
        methods[method] = {s.name: read_json(s.metrics_path(cfg, method)) for s in STAGES
                           if s.per_method and s.metrics_path(cfg, method).exists()}
    return {"shared": shared, "methods": methods, "time_budget": cfg.select.time_budget}


def run_compare(cfg: Any, track: bool = True) -> dict[str, Any]:
    """Stage `compare`: report/compare.md + compare.json; one MLflow parent run (nested stages)."""
    collected = collect(cfg)
    rows = summarise(collected)
    out = cfg.artifact("report")
    table = markdown_table(rows)
    atomic_write_text(out / "compare.md", "# clusterft: methods compared\n\n" + table)
    summary = {"rows": rows}
    if track:
        summary["mlflow_run_id"] = log_pipeline(cfg, collected, rows, [out / "compare.md"])
    write_json(out / "compare.json", {"rows": rows,  # by_method: numbers `dvc metrics` / `dvc exp show` list
                                      "by_method": {r["method"]: {k: v for k, v in r.items() if k != "method"}
                                                    for r in rows}})
    print(table)
    return summary
