import numpy as np
import pytest

from clusterft.selection import (
    SelectionError, budget_count, select_cluster, select_full, select_random, unbiased_weights, waterfill,
)


def test_waterfill_equal_quota_capped_and_exact():
    assert waterfill(np.array([100, 5, 40, 1]), 40).tolist() == [17, 5, 17, 1]
    assert waterfill(np.array([10, 10, 10]), 30).tolist() == [10, 10, 10]
    q = waterfill(np.array([7, 3, 9, 2, 50]), 23)
    assert q.sum() == 23 and (q <= [7, 3, 9, 2, 50]).all() and q.tolist() == [6, 3, 6, 2, 6]
    with pytest.raises(SelectionError):
        waterfill(np.array([1, 2]), 4)


def test_budget_count_fraction_or_count():
    assert budget_count(0.25, 100) == 25 and budget_count(30, 100) == 30 and budget_count(1.0, 7) == 7
    with pytest.raises(SelectionError, match="asks for 200"):
        budget_count(200, 100)
    with pytest.raises(SelectionError, match="> 0"):
        budget_count(0, 100)


def test_weights_make_weighted_cluster_mass_match_original_sizes():
    sizes = np.array([80, 15, 5])
    quotas = waterfill(sizes, 30)  # [10, 15, 5]
    clusters = np.repeat(np.arange(3), quotas)
    w = unbiased_weights(sizes, quotas, clusters)
    assert w.mean() == pytest.approx(1.0)
    mass = np.array([w[clusters == k].sum() for k in range(3)])
    np.testing.assert_allclose(mass / mass.sum(), sizes / sizes.sum())
    flat = unbiased_weights(sizes, quotas, clusters, alpha=0.0)
    np.testing.assert_allclose(flat, 1.0)


def test_select_cluster_keeps_far_points_and_covers_every_cluster():
    rng = np.random.default_rng(0)
    centers = np.eye(3, dtype=np.float32)
    labels = np.repeat([0, 1, 2], [60, 30, 10])
    feats = centers[labels] + 0.1 * rng.normal(size=(100, 3)).astype(np.float32)
    sel = select_cluster(labels, feats, centers, 0.3, seed=0, within="far")
    assert len(sel.rows) == 30 and set(sel.clusters) == {0, 1, 2}
    assert (sel.clusters == 2).sum() == 10  # small cluster kept whole
    x = feats / np.linalg.norm(feats, axis=1, keepdims=True)
    d = np.linalg.norm(x - centers[labels], axis=1)
    kept0 = d[sel.rows[sel.clusters == 0]]
    dropped0 = np.delete(d, sel.rows)[labels[np.setdiff1d(np.arange(100), sel.rows)] == 0]
    assert kept0.min() >= dropped0.max()
    near = select_cluster(labels, feats, centers, 0.3, seed=0, within="near")
    rest0 = np.setdiff1d(np.flatnonzero(labels == 0), near.rows)
    assert d[near.rows[near.clusters == 0]].max() <= d[rest0].min()


def test_full_and_random():
    assert len(select_full(10).rows) == 10
    r1, r2 = select_random(100, 0.2, 3), select_random(100, 0.2, 3)
    assert len(r1.rows) == 20 and (r1.rows == r2.rows).all() and len(set(r1.rows)) == 20
