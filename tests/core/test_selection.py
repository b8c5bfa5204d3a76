import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterft.core.selection import (
    budget_count,
    duplicate_groups,
    kcenter_greedy,
    select_cluster,
    select_cluster_paper,
    select_full,
    select_random,
    soft_cap_reassign,
    split_budget,
    unbiased_weights,
    waterfill,
)
from clusterft.errors import SelectionError


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


# --- property-based invariants and the paper-faithful mode -------------------------------


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=12), st.floats(0.01, 1.0),
       st.sampled_from([0.0, 0.5, 1.0, 2.0]))
def test_split_budget_is_exact_capped_and_monotone_in_size(sizes, frac, tau):
    sizes = np.array(sizes)
    total = int(frac * sizes.sum())
    q = split_budget(sizes, total, tau)
    assert q.sum() == total and (q <= sizes).all() and (q >= 0).all()
    order = np.argsort(sizes, kind="stable")  # bigger clusters never get fewer (ties: +-1 rounding)
    assert (np.diff(q[order]) >= -1).all()


def test_proportional_and_power_splits():
    sizes = np.array([800, 150, 50])
    assert split_budget(sizes, 100, 1.0).tolist() == [80, 15, 5]
    p = split_budget(sizes, 100, 0.5)
    assert p.sum() == 100 and p[0] < 80 and p[2] > 5


@settings(max_examples=40, deadline=None)
@given(st.integers(20, 200), st.integers(1, 8), st.floats(0.05, 1.0), st.integers(0, 1000),
       st.sampled_from(["far", "near", "random", "kcenter"]), st.sampled_from(["waterfill", "proportional", "power"]),
       st.booleans())
def test_cluster_selection_invariants(n, k, budget, seed, within, split, duplicates):
    rng = np.random.default_rng(seed)
    k = min(k, n)
    labels = np.concatenate([np.arange(k), rng.integers(0, k, size=n - k)])
    feats = rng.normal(size=(n, 4)).astype(np.float32)
    if duplicates:  # real data repeats itself: many rows with identical features
        feats = feats[rng.integers(0, 3, size=n)]
    centers = np.stack([feats[labels == c].mean(0) for c in range(k)])
    sel = select_cluster(labels, feats, centers, budget, seed, within=within, split=split)
    assert len(sel.rows) == max(1, int(round(budget * n)))
    assert len(set(sel.rows.tolist())) == len(sel.rows)
    assert sel.weights.mean() == pytest.approx(1.0)
    again = select_cluster(labels, feats, centers, budget, seed, within=within, split=split)
    assert (again.rows == sel.rows).all() and (again.weights == sel.weights).all()


def test_kcenter_returns_distinct_rows_even_when_rows_are_identical():
    x = np.concatenate([np.zeros((6, 2)), np.ones((4, 2))])
    got = kcenter_greedy(x, 8, start=0).tolist()
    assert len(set(got)) == 8
    assert got[1] >= 6  # the other point first, then the duplicates
    with pytest.raises(SelectionError, match="m <= 10"):
        kcenter_greedy(x, 11, start=0)


def test_kcenter_spreads_out():
    x = np.array([[0, 0], [0.1, 0], [10, 0], [10.1, 0], [0, 10]], dtype=float)
    assert sorted(kcenter_greedy(x, 3, start=0).tolist()) == [0, 2, 4] or \
        sorted(kcenter_greedy(x, 3, start=0).tolist()) == [0, 3, 4]


def test_soft_cap_moves_closest_points_first_to_nearest_centre_with_room():
    x = np.array([[0.0], [0.1], [0.2], [0.3], [1.0]])
    centers = np.array([[0.0], [1.0]])
    labels = np.array([0, 0, 0, 0, 1])
    out = soft_cap_reassign(x, labels, centers, cap=3)
    # closest points to a centre are placed first: 0.0, 1.0, 0.1, 0.2 fill; 0.3 finds cluster 0 full
    assert out.tolist() == [0, 0, 0, 1, 1]
    assert (soft_cap_reassign(x, labels, centers, cap=4) == labels).all()  # under the cap: unchanged


def test_paper_mode_rules_on_a_hand_checked_case():
    """Two well separated groups (60 and 20 points), 2 workers, r = 0.5: the small cluster
    sets m = floor(20 * 0.5) = 10 for both; weights are K n_k / N = 2*60/80 and 2*20/80."""
    rng = np.random.default_rng(0)
    a = np.array([1.0, 0.0]) + 0.05 * rng.normal(size=(60, 2))
    b = np.array([0.0, 1.0]) + 0.05 * rng.normal(size=(20, 2))
    sel = select_cluster_paper(np.concatenate([a, b]).astype(np.float32), world_size=2, ratio=0.5, seed=0)
    assert len(sel.rows) == 20
    big = sel.clusters[sel.rows < 60][0]
    assert (sel.clusters[sel.rows < 60] == big).all() and (sel.rows < 60).sum() == 10
    assert sorted(set(np.round(sel.weights, 6))) == [0.5, 1.5]
    assert sel.weights[sel.rows < 60][0] == pytest.approx(1.5)
    # the kept points of the big group are its 10 farthest from the centre
    x = np.concatenate([a, b])
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    d = np.linalg.norm(x[:60] - x[:60].mean(0), axis=1)
    assert set(sel.rows[sel.rows < 60]) == set(np.argsort(-d)[:10])


def test_paper_mode_budget_collapses_with_a_tiny_cluster():
    """The limit clusterft removes: one tiny cluster shrinks every cluster to its size."""
    rng = np.random.default_rng(1)
    x = np.concatenate([np.array([1.0, 0.0, 0.0]) + 0.02 * rng.normal(size=(50, 3)),
                        np.array([0.0, 1.0, 0.0]) + 0.02 * rng.normal(size=(47, 3)),
                        np.array([0.0, 0.0, 1.0]) + 0.02 * rng.normal(size=(3, 3))]).astype(np.float32)
    sel = select_cluster_paper(x, world_size=3, ratio=1.0, seed=0)  # cap 50: no reassignment
    assert len(sel.rows) == 9  # 3 clusters x min size 3, although r = 1.0


def test_dedup_spends_the_budget_on_distinct_samples_and_keeps_the_copies_mass():
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(100, 4)).astype(np.float32)  # copies need not share features
    texts = [f"item {i % 2}" for i in range(50)] + [f"other {i}" for i in range(50)]
    groups = duplicate_groups(texts)
    labels = np.repeat([0, 1], 50)
    centers = np.stack([feats[:50].mean(0), feats[50:].mean(0)])
    plain = select_cluster(labels, feats, centers, 20, 0, within="kcenter")
    dedup = select_cluster(labels, feats, centers, 20, 0, within="kcenter", alpha=0.5, groups=groups)
    assert np.bincount(plain.clusters).tolist() == [10, 10]  # 8 of cluster 0's rows are copies
    assert np.bincount(dedup.clusters).tolist() == [2, 18]
    assert len(np.unique(groups[dedup.rows])) == 20
    w = dict(zip(dedup.clusters.tolist(), dedup.weights.tolist()))
    assert w[0] / w[1] == pytest.approx((50 / 2) ** 0.5 / (50 / 18) ** 0.5)  # alpha 0.5, full sizes
    more = select_cluster(labels, feats, centers, 60, 0, within="kcenter", groups=groups)
    assert len(more.rows) == 60 and np.bincount(more.clusters)[1] == 50  # distinct first, then copies


@pytest.mark.parametrize("within", ["far", "near", "random", "kcenter"])
def test_every_within_rule_takes_distinct_samples_before_copies(within):
    rng = np.random.default_rng(1)
    feats = rng.normal(size=(60, 3)).astype(np.float32)
    groups = duplicate_groups([f"t{i % 12}" for i in range(60)])  # 12 texts, 5 copies each
    labels = np.zeros(60, dtype=np.int64)
    sel = select_cluster(labels, feats, feats.mean(0, keepdims=True), 12, 0, within=within,
                         groups=groups)
    assert sorted(groups[sel.rows].tolist()) == list(range(12))


def test_duplicate_groups_ignore_case_and_whitespace():
    assert duplicate_groups(["A  b", "a b", "a c", " a\tB "]).tolist() == [0, 0, 1, 0]


def test_a_budget_above_the_distinct_content_fills_with_copies_or_stops_there():
    rng = np.random.default_rng(2)
    feats = rng.normal(size=(100, 4)).astype(np.float32)
    texts = [f"item {i % 5}" for i in range(60)] + [f"other {i}" for i in range(40)]  # 45 distinct
    groups = duplicate_groups(texts)
    labels = np.repeat([0, 1], [60, 40])
    centers = np.stack([feats[:60].mean(0), feats[60:].mean(0)])
    copies = select_cluster(labels, feats, centers, 70, 0, within="kcenter", groups=groups)
    distinct = select_cluster(labels, feats, centers, 70, 0, within="kcenter", groups=groups, fill="distinct")
    assert len(copies.rows) == 70 and np.bincount(copies.clusters).tolist() == [30, 40]
    assert len(distinct.rows) == 45 and np.bincount(distinct.clusters).tolist() == [5, 40]
    assert len(np.unique(groups[distinct.rows])) == 45
    below = select_cluster(labels, feats, centers, 30, 0, within="kcenter", groups=groups, fill="distinct")
    assert len(below.rows) == 30  # under the distinct content both fills meet the budget
