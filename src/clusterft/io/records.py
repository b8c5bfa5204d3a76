"""A method's records, read and written in one place: its selection (selection.jsonl), its
per-epoch quotas (quotas.json, and the cluster_dynamic source built from them) and its
allocation plan (plan.npy + plan.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from clusterft.core.allocation import PLAN_COLUMNS, AllocationPlan
from clusterft.core.dynamic import ClusterDynamicSource
from clusterft.core.selection import Selection
from clusterft.io.artifacts import load_npy, read_json, save_npy, write_json
from clusterft.io.examples import write_jsonl


def write_selection(path: str | Path, selection: Selection, ids: list[str]) -> None:
    """selection.jsonl: one line per kept sample {id, row, cluster, weight}, by row."""
    write_jsonl(path, ({"id": ids[r], "row": int(r), "cluster": int(c), "weight": round(float(w), 8)}
                       for r, c, w in zip(selection.rows, selection.clusters, selection.weights)))


def read_selection(path: str | Path) -> dict[str, list]:
    """Columns of a selection.jsonl: id, row, cluster, weight."""
    cols: dict[str, list] = {"id": [], "row": [], "cluster": [], "weight": []}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        for k in cols:
            cols[k].append(rec[k])
    return cols


def write_quotas(path: str | Path, quotas: dict[int, int], epochs: int | None = None) -> None:
    """quotas.json: samples per epoch of each cluster (and the epochs a time budget chose)."""
    write_json(path, {"per_epoch": sum(quotas.values()), "quotas": quotas,
                      **({"epochs": epochs} if epochs is not None else {})})


def dynamic_source(cfg: Any, mdir: Path, clusters: np.ndarray, lengths: np.ndarray,
                   rank: int) -> ClusterDynamicSource:
    """cluster_dynamic's batch source for methods/<m>/: its pool's clusters and lengths, the
    quotas and epochs select wrote to quotas.json (a time budget may run fewer epochs)."""
    doc = read_json(mdir / "quotas.json")
    quotas = {int(c): q for c, q in doc["quotas"].items()}
    t = cfg.train
    return ClusterDynamicSource(clusters, quotas, lengths, t.nproc, t.per_device_batch, doc.get("epochs", t.epochs),
                                t.seed, rank, t.dynamic_hard, t.allocation)


def save_plan(out_dir: str | Path, plan: AllocationPlan, extra: dict | None = None) -> None:
    """plan.npy (int64 rows epoch, step, rank, index) + plan.json manifest."""
    out = Path(out_dir)
    save_npy(out / "plan.npy", plan.table)
    write_json(out / "plan.json", {
        "columns": list(PLAN_COLUMNS), "world_size": plan.world_size, "epochs": plan.epochs,
        "steps_per_epoch": plan.steps_per_epoch, **(extra or {}),
    })


def load_plan(out_dir: str | Path) -> AllocationPlan:
    out = Path(out_dir)
    meta = read_json(out / "plan.json")
    return AllocationPlan(load_npy(out / "plan.npy"), meta["world_size"], meta["epochs"], meta["steps_per_epoch"])
