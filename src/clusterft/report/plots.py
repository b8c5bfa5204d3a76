"""Pictures a person looks at: cluster sizes, weights, and the rank x cluster allocation."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clusterft.io.artifacts import atomic_path


def figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")


def cluster_sizes(before: np.ndarray, after: np.ndarray, path: Path) -> None:
    """Bars per cluster: original size and kept count (log scale), largest first."""
    plt = figure()
    order = np.argsort(-before, kind="stable")
    fig, ax = plt.subplots(figsize=(7, 3.2))
    x = np.arange(len(before))
    ax.bar(x - 0.2, before[order], 0.4, label="original")
    ax.bar(x + 0.2, after[order], 0.4, label="selected")
    ax.set_yscale("log")
    ax.set_xticks(x, [str(i) for i in order], fontsize=7)
    ax.set_xlabel("cluster (largest first)")
    ax.set_ylabel("samples")
    ax.legend()
    ax.set_title("Cluster sizes before and after selection")
    save_figure(fig, path)
    plt.close(fig)


def weight_histogram(weights: np.ndarray, path: Path) -> None:
    plt = figure()
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.hist(weights, bins=40)
    ax.set_xlabel("per-sample loss weight (mean 1)")
    ax.set_ylabel("samples")
    ax.set_title("Selection weights")
    save_figure(fig, path)
    plt.close(fig)


def allocation_heatmap(counts: np.ndarray, path: Path) -> None:
    """counts: [ranks, clusters] samples per rank and cluster over one epoch."""
    plt = figure()
    fig, ax = plt.subplots(figsize=(max(4, 0.35 * counts.shape[1] + 2), 0.5 * counts.shape[0] + 1.5))
    im = ax.imshow(counts, aspect="auto", cmap="viridis")
    ax.set_xlabel("cluster")
    ax.set_ylabel("rank")
    ax.set_yticks(range(counts.shape[0]))
    fig.colorbar(im, ax=ax, label="samples in epoch 0")
    ax.set_title("Allocation: samples per rank and cluster")
    save_figure(fig, path)
    plt.close(fig)
