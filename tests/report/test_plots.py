"""The pictures are real PNG files, written atomically where the stages say."""

import numpy as np

from clusterft.report import plots

PNG = b"\x89PNG\r\n\x1a\n"


def test_each_plot_writes_a_png(tmp_path):
    plots.cluster_sizes(np.array([50, 5, 20]), np.array([10, 5, 10]), tmp_path / "a" / "sizes.png")
    plots.weight_histogram(np.array([0.5, 1.0, 1.5, 1.0]), tmp_path / "weights.png")
    plots.allocation_heatmap(np.array([[3, 1], [2, 2]]), tmp_path / "alloc.png")
    for name in ("a/sizes.png", "weights.png", "alloc.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 2000, name
    assert not list(tmp_path.rglob("*.tmp"))
