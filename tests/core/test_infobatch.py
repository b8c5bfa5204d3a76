import numpy as np
import pytest

from clusterft.core.infobatch import InfoBatchSource


def test_prunes_only_below_mean_and_rescales_the_kept_ones():
    src = InfoBatchSource(n=400, world=2, per_device_batch=10, epochs=8, seed=0, rank=0, prune=0.5)
    src.scores = np.where(np.arange(400) < 200, 0.1, 2.0)  # first half well learned
    src.epoch_scores = src.scores.copy()
    order, rescale = src._epoch(0)
    kept = set(order.tolist())
    assert set(range(200, 400)) <= kept  # above-mean samples are never dropped
    dropped_low = 200 - len(kept & set(range(200)))
    assert 70 < dropped_low < 130  # ~ prune * 200
    assert np.allclose(rescale[[i for i in kept if i < 200]], 2.0) and np.allclose(rescale[200:], 1.0)


def test_last_epochs_train_on_everything_and_ranks_partition_each_step():
    srcs = [InfoBatchSource(n=101, world=2, per_device_batch=5, epochs=8, seed=3, rank=r, prune=0.5) for r in (0, 1)]
    for s in srcs:
        s.scores = np.linspace(0, 1, 101)
    steps = [list(s.batches()) for s in srcs]
    assert len(steps[0]) == len(steps[1])
    for (e0, s0, i0, n0, _), (e1, s1, i1, n1, _) in zip(*steps):
        assert (e0, s0, n0) == (e1, s1, n1) and len(i0) + len(i1) == n0 and not set(i0) & set(i1)
    per_epoch = srcs[0].kept_per_epoch
    assert per_epoch[-1] == 101 and per_epoch[0] < 101  # epoch 7 >= 0.875 * 8: no pruning


def test_state_roundtrip_and_bad_prune():
    a = InfoBatchSource(n=50, world=1, per_device_batch=5, epochs=2, seed=0, rank=0)
    a.observe(np.arange(10), np.full(10, 0.2))
    b = InfoBatchSource(n=50, world=1, per_device_batch=5, epochs=2, seed=0, rank=0)
    b.load_state_dict(a.state_dict())
    assert (b.scores == a.scores).all()
    with pytest.raises(ValueError, match="infobatch_prune"):
        InfoBatchSource(n=5, world=1, per_device_batch=1, epochs=1, seed=0, rank=0, prune=1.0)


@pytest.mark.parametrize("epochs", [1, 2, 3, 8])
def test_expected_steps_match_the_steps_trained(epochs):
    """The lr schedule's length: epoch 0 prunes nothing (no losses seen yet), so with 2
    epochs (the last 12.5% unpruned) InfoBatch trains every sample twice."""
    src = InfoBatchSource(n=400, world=2, per_device_batch=10, epochs=epochs, seed=1, rank=0, prune=0.5)
    rng = np.random.default_rng(0)
    steps = 0
    for _e, _s, idx, n, _r in src.batches():
        steps += 1
        src.observe(np.arange(400), rng.random(400))  # fresh losses: about half below the mean
    assert abs(steps - src.total_steps) <= max(1, 0.03 * steps), (steps, src.total_steps)
    if epochs <= 2:
        assert steps == src.total_steps == epochs * 20
