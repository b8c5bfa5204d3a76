import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterft.allocation import (
    AllocationError, build_plan, load_plan, plan_metrics, rank_cluster_counts, save_plan, step_cluster_counts,
)


def clusters_zipf(m=300, seed=0):
    rng = np.random.default_rng(seed)
    return rng.choice(6, size=m, p=[0.4, 0.25, 0.15, 0.1, 0.06, 0.04])


def lengths_for(m, seed=0):
    return np.random.default_rng(seed).integers(10, 90, size=m)


@st.composite
def selections(draw):
    m = draw(st.integers(8, 160))
    k = draw(st.integers(1, 7))
    clusters = np.array(draw(st.lists(st.integers(0, k - 1), min_size=m, max_size=m)))
    lengths = np.array(draw(st.lists(st.integers(1, 64), min_size=m, max_size=m)))
    world = draw(st.integers(1, min(8, m)))
    batch = draw(st.integers(1, 6))
    return clusters, lengths, world, batch, draw(st.integers(0, 2**16))


@settings(max_examples=60, deadline=None)
@given(selections())
def test_plan_invariants(case):
    clusters, lengths, world, batch, seed = case
    plan = build_plan(clusters, world, batch, epochs=2, seed=seed, mode="balanced", lengths=lengths)
    t = plan.table
    sizes = plan.step_sizes()
    assert sizes.max() - sizes.min() <= 1
    ids, inv = np.unique(clusters, return_inverse=True)
    share = np.bincount(inv) / len(inv)
    for e in range(2):
        te = t[t[:, 0] == e]
        assert sorted(te[:, 3]) == list(range(len(clusters)))  # each sample exactly once per epoch
        for s in range(plan.steps_per_epoch):
            st_ = te[te[:, 1] == s]
            assert set(st_[:, 2]) == set(range(world))  # every rank works every step
            counts = np.bincount(inv[st_[:, 3]], minlength=len(ids))
            assert np.abs(counts - len(st_) * share).max() < 1 + 1e-9  # within one sample
    again = build_plan(clusters, world, batch, epochs=2, seed=seed, mode="balanced", lengths=lengths)
    assert again.table.tobytes() == plan.table.tobytes()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=8), st.integers(1, 12), st.data())
def test_matrix_rounding_meets_margins(cluster_sizes, n_steps, data):
    m = np.array(cluster_sizes)
    n_steps = min(n_steps, int(m.sum()))
    steps = np.array([len(c) for c in np.array_split(np.arange(m.sum()), n_steps)])
    out = step_cluster_counts(m, steps)
    target = np.outer(steps, m) / m.sum()
    assert (out.sum(1) == steps).all() and (out.sum(0) == m).all()
    assert (np.abs(out - target) < 1).all()


@pytest.mark.parametrize("world", [2, 4, 8])
def test_token_balance_beats_shuffled_sampler(world):
    c = clusters_zipf(1200)
    lengths = lengths_for(1200)
    ours = plan_metrics(build_plan(c, world, 16, 1, 0, "balanced", lengths), c, lengths)
    shuf = plan_metrics(build_plan(c, world, 16, 1, 0, "shuffle", lengths), c, lengths)
    assert ours["token_imbalance_mean"] <= 1.05 < shuf["token_imbalance_mean"]
    assert ours["coverage_error_max"] < 1 < shuf["coverage_error_max"]
    assert ours["rank_cluster_coverage"] == 1.0


def test_every_rank_sees_every_cluster_each_epoch():
    c = np.repeat([0, 1], 64)  # two equal clusters: a naive interleave pins rank k to cluster k
    plan = build_plan(c, 2, 4, 1, 0)
    assert (rank_cluster_counts(plan, c) > 0).all()


def test_rank_per_cluster_is_the_papers_allocation():
    c = np.repeat([0, 1, 2], 10)
    plan = build_plan(c, 3, 2, 2, 0, mode="rank_per_cluster")
    counts = rank_cluster_counts(plan, c)
    assert (counts == np.diag([10, 10, 10])).all() and plan.steps_per_epoch == 5
    with pytest.raises(AllocationError, match="one per rank"):
        build_plan(c, 2, 2, 1, 0, mode="rank_per_cluster")


def test_rank_batches_iterate_in_order_and_roundtrip(tmp_path):
    c = clusters_zipf(100)
    plan = build_plan(c, 2, 5, 2, 0)
    save_plan(tmp_path, plan)
    again = load_plan(tmp_path)
    assert (again.table == plan.table).all()
    steps = list(again.rank_batches(1))
    assert len(steps) == 2 * plan.steps_per_epoch and all(len(i) >= 1 for _, _, i in steps)


def test_more_workers_than_samples_is_an_error():
    with pytest.raises(AllocationError, match="train.nproc=8 workers but only 5"):
        build_plan(np.zeros(5, int), 8, 1, 1, 0)
