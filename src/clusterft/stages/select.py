"""Stage `select`: the training subset of one method and its per-sample weights
(selection.jsonl), its per-epoch quota per cluster (quotas.json) and select_metrics.json.
Under a time budget the data budget is planned from the probe's timings (stages.timeplan).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from clusterft.core.selection import (
    Selection,
    budget_count,
    duplicate_groups,
    select_cluster,
    select_cluster_dynamic,
    select_cluster_paper,
    select_full,
    select_random,
)
from clusterft.errors import SelectionError
from clusterft.io.artifacts import file_digest, load_npy, write_json
from clusterft.io.records import write_quotas, write_selection
from clusterft.report import plots
from clusterft.runtime.data import load_examples
from clusterft.spec.methods import METHODS, time_budgeted
from clusterft.stages.timeplan import time_planned


def _plot_selection(cfg: Any, sel: Selection, plot_dir: Path) -> None:
    """Cluster sizes before/after (against the k-means clusters when they exist) and weights."""
    labels_path = cfg.artifact("cluster", "labels.npy")
    if labels_path.exists():
        labels = load_npy(labels_path)
        k = int(labels.max()) + 1
        before = np.bincount(labels, minlength=k)
        after = np.bincount(labels[sel.rows], minlength=k)
        plots.cluster_sizes(before, after, plot_dir / "cluster_sizes.png")
    plots.weight_histogram(sel.weights, plot_dir / "weights.png")


def check_features_current(cfg: Any) -> None:
    """Features must come from the current data.train (its digest is in the features
    manifest) and the clusters from the current features (their digest is in the cluster
    metrics). Refused before any selection is written."""
    path = cfg.artifact("features", "manifest.json")
    made_from = json.loads(path.read_text()).get("data_digest") if path.exists() else None
    if made_from and made_from != file_digest(cfg.data.train):
        raise SelectionError(
            f"{path}: the features were computed from another version of {cfg.data.train}; "
            "rerun warmup, features and cluster on the current data (`dvc repro` does)")
    metrics, feats = cfg.artifact("cluster", "metrics.json"), cfg.artifact("features", "features.npy")
    made_from = json.loads(metrics.read_text()).get("features_digest") if metrics.exists() else None
    if made_from and feats.exists() and made_from != file_digest(feats):
        raise SelectionError(
            f"{cfg.artifact('cluster', 'labels.npy')}: the clusters were computed from another version "
            f"of {feats}; rerun cluster (`dvc repro` does)")


def _clusters(cfg: Any, method: str, n: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(labels, centers) of the cluster stage for the methods that use them, checked to be
    current and to cover the n train samples; (None, None) for the others."""
    if method in ("cluster", "cluster_dynamic", "cluster_paper"):
        check_features_current(cfg)
    if method not in ("cluster", "cluster_dynamic"):
        return None, None
    labels = load_npy(cfg.artifact("cluster", "labels.npy"))
    if len(labels) != n:
        raise SelectionError(
            f"{cfg.artifact('cluster', 'labels.npy')}: {len(labels)} labels for {n} train samples; "
            "rerun features and cluster on the current data"
        )
    return labels, load_npy(cfg.artifact("cluster", "centers.npy"))


def _choose(cfg: Any, method: str, budget: float, n: int, groups: np.ndarray, labels: np.ndarray | None,
            centers: np.ndarray | None) -> tuple[Selection, dict]:
    """The method's selection under `budget`, and its per-epoch quota per cluster."""
    s = cfg.select
    if METHODS[method].budget is None:  # full; infobatch prunes during training, not before
        sel = select_full(n)
    elif method == "random":
        sel = select_random(n, budget, s.seed)
    elif method == "cluster_dynamic":
        sel, quotas = select_cluster_dynamic(labels, len(centers), budget, s.split, s.tau, s.alpha,
                                             groups if s.dedup else None, s.fill)
        return sel, quotas
    elif method == "cluster":
        sel = select_cluster(labels, load_npy(cfg.artifact("features", "features.npy"), mmap=True), centers,
                             budget, s.seed, s.within, s.alpha, s.split, s.tau, groups if s.dedup else None,
                             s.fill)
    elif method == "cluster_paper":
        sel = select_cluster_paper(load_npy(cfg.artifact("features", "features.npy")), cfg.train.nproc,
                                   s.paper_ratio, s.seed)
    else:
        raise SelectionError(f"unknown select method {method!r}")
    # a static selection trains its own counts every epoch
    return sel, {int(c): int(q) for c, q in zip(*np.unique(sel.clusters, return_counts=True))}


def _asked(method: str, budget: float, n: int, planned) -> int | None:
    """Samples per epoch the data budget (or the time plan) asks of `method`; None: it has
    no data budget (full, infobatch; cluster_paper's ratio is a cut, not a count)."""
    if METHODS[method].budget != "select.budget":
        return None
    return planned.samples_per_epoch if planned else budget_count(budget, n)


def run_select(cfg: Any, method: str, run: str | None = None) -> dict:
    """Stage `select`: writes methods/<method>/selection.jsonl, quotas.json (per-epoch quota
    per cluster; the epochs when a time budget chose them) and select_metrics.json (with the
    time plan under a time budget)."""
    start = time.perf_counter()
    examples = load_examples(cfg, "train")
    ids = [e.id for e in examples]
    n = len(ids)
    groups = duplicate_groups([f"{e.prompt}\n{e.response}" for e in examples])
    s = cfg.select
    labels, centers = _clusters(cfg, method, n)

    def choose(budget: float) -> tuple[Selection, dict]:
        return _choose(cfg, method, budget, n, groups, labels, centers)

    planned, epochs = None, cfg.train.epochs
    if time_budgeted(method, s.time_budget):
        k = int(len(np.unique(labels))) if labels is not None else 0
        sel, quotas, planned = time_planned(cfg, method, examples, choose, k, start)
        epochs = planned.epochs
    else:
        sel, quotas = choose(s.budget)
    out = cfg.method_dir(method, run)
    write_selection(out / "selection.jsonl", sel, ids)
    write_quotas(out / "quotas.json", quotas, epochs if planned else None)  # else train.epochs, as every method
    metrics = {
        "method": method,
        "n_train": n,
        "n_selected": int(len(sel.rows)),
        "trained_per_epoch": sum(quotas.values()),
        "epochs": epochs,
        "kept_fraction": sum(quotas.values()) / n,  # trained per epoch
        "budget_samples": _asked(method, s.budget, n, planned),
        "n_distinct_train": int(len(np.unique(groups))),  # distinct prompt + answer pairs
        "kept_distinct": int(len(np.unique(groups[sel.rows]))),
        "weight_min": float(sel.weights.min()),
        "weight_max": float(sel.weights.max()),
        **({"time_plan": planned.record()} if planned else {}),
        "wall_clock_s": time.perf_counter() - start,  # the plots below are not part of the cost
    }
    write_json(out / "select_metrics.json", metrics)
    _plot_selection(cfg, sel, out / "plots")
    return metrics
