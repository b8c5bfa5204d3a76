"""cluster_dynamic's per-epoch draw: quotas kept, rotation without replacement inside each
cluster, the same draw on every rank, the hardest samples first when asked, exact resume."""

import numpy as np
import pytest

from clusterft.core.dynamic import ClusterDynamicSource
from clusterft.core.selection import select_cluster_dynamic

CLUSTERS = np.repeat([0, 1, 2], [12, 6, 2])  # a big, a middle and a tiny cluster
QUOTAS = {0: 4, 1: 3, 2: 2}


def _source(rank=0, hard=0.0, epochs=6, world=2):
    return ClusterDynamicSource(CLUSTERS, QUOTAS, np.arange(len(CLUSTERS)) % 5 + 3, world, 2, epochs, 7,
                                rank, hard)


def _epochs(sources):
    """Per epoch, the samples all ranks trained (checked disjoint per step)."""
    out: dict[int, list[int]] = {}
    for steps in zip(*(s.batches() for s in sources)):
        (e, st, _, size, _), shares = steps[0], [b[2] for b in steps]
        assert all(b[0] == e and b[1] == st and b[3] == size for b in steps)
        assert all(len(x) >= 1 for x in shares) and sum(len(x) for x in shares) == size
        merged = np.concatenate(shares)
        assert len(set(merged.tolist())) == len(merged)
        out.setdefault(e, []).extend(merged.tolist())
    return out


def test_every_epoch_keeps_the_quotas_and_the_ranks_share_one_draw():
    epochs = _epochs([_source(0), _source(1)])
    assert len(epochs) == 6
    for drawn in epochs.values():
        counts = np.bincount(CLUSTERS[drawn], minlength=3)
        assert counts.tolist() == [4, 3, 2] and len(set(drawn)) == len(drawn)


def test_big_clusters_rotate_without_replacement_until_used_up():
    epochs = _epochs([_source(0), _source(1)])
    c0 = [sorted(i for i in epochs[e] if CLUSTERS[i] == 0) for e in range(6)]
    assert sorted(c0[0] + c0[1] + c0[2]) == list(range(12))  # 3 epochs x 4 = the 12 samples once
    assert sorted(c0[3] + c0[4] + c0[5]) == list(range(12))  # and again in the next cycle
    c1 = [i for e in (0, 1) for i in epochs[e] if CLUSTERS[i] == 1]
    assert sorted(c1) == list(range(12, 18))


def test_hard_share_takes_the_highest_loss_unused_samples_first():
    src = _source(hard=1.0, epochs=2, world=1)
    src.observe(np.arange(20), np.arange(20, dtype=float))  # loss grows with the index
    per_epoch = {0: [], 1: []}
    for e, _, idx, _, _ in src.batches():
        per_epoch[e] += [int(i) for i in idx if CLUSTERS[i] == 0]
    assert sorted(per_epoch[0]) == [8, 9, 10, 11] and sorted(per_epoch[1]) == [4, 5, 6, 7]


def test_resume_mid_epoch_replays_the_same_draw_and_continues():
    a = _source(hard=0.5)
    it = a.batches()
    seen = [next(it) for _ in range(5)]  # into epoch 1 or 2
    epoch, step = seen[-1][0], seen[-1][1] + 1
    b = _source(hard=0.5)
    b.load_state_dict(a.state_dict())
    rest_b = [(e, s, idx.tolist()) for e, s, idx, _, _ in b.batches(epoch, resumed=True) if (e, s) >= (epoch, step)]
    rest_a = [(e, s, idx.tolist()) for e, s, idx, _, _ in it]
    assert rest_a == rest_b


@pytest.mark.parametrize("dedup", [True, False])
def test_pool_weights_keep_each_cluster_mass_per_epoch(dedup):
    labels = np.repeat([0, 1, 2], [30, 10, 5])
    groups = np.arange(45)
    groups[:10] = 0  # ten copies of one sample in the big cluster
    sel, quotas = select_cluster_dynamic(labels, 3, 9, "waterfill", 0.5, 1.0, groups if dedup else None)
    assert sum(quotas.values()) == 9
    assert dedup == (len(sel.rows) == 36)  # copies leave the pool, their mass stays in the weights
    per_cluster = {c: sel.weights[sel.clusters == c][0] * q for c, q in quotas.items()}
    mass = np.array([per_cluster[c] for c in sorted(per_cluster)])
    np.testing.assert_allclose(mass / mass.sum(), [30 / 45, 10 / 45, 5 / 45])
    np.testing.assert_allclose(sum(sel.weights[sel.clusters == c][0] * q for c, q in quotas.items()), 9)


