"""Planning a data budget from a time budget (clusterft.core.timebudget): the chosen size fits,
one more sample would not, and an impossible budget is refused with the smallest that fits."""

import re

import pytest

from clusterft.core.timebudget import TimeModel, plan_time_budget
from clusterft.errors import TimeBudgetError

TM = TimeModel(setup_s=3.0, encode_s=0.001, first_step_s=0.5, step_fixed_s=0.0, step_per_char_s=0.002,
               checkpoint_s=0.7, checkpoint_every=50, save_s=1.0, tracking_s=0.0, samples_per_step=32)
ARGS = dict(tm=TM, n=6000, chars_all=100.0, chars_sel=100.0, epochs=12, min_per_epoch=16)


def test_the_chosen_size_fits_and_one_more_sample_would_not():
    plan = plan_time_budget(0.3, spent_s=10.0, may_cut_epochs=False, **ARGS)
    full = TM.train_s(6000, 12, 100.0)
    assert plan.full_train_s == pytest.approx(full)
    assert plan.target_s == pytest.approx(0.3 * full)
    assert plan.planned_end_to_end_s <= plan.target_s
    m = plan.samples_per_epoch
    over = 10.0 + TM.allocate_s(m + 1) + TM.train_s(m + 1, 12, 100.0)
    assert over > plan.target_s
    assert plan.epochs == 12 and 0 < m < 6000


def test_seconds_and_longer_samples():
    secs = plan_time_budget(60.0, spent_s=10.0, may_cut_epochs=False, **ARGS)
    assert secs.target_s == 60.0 and secs.planned_end_to_end_s <= 60.0
    longer = plan_time_budget(60.0, spent_s=10.0, may_cut_epochs=False, **{**ARGS, "chars_sel": 200.0})
    assert 0.45 < longer.samples_per_epoch / secs.samples_per_epoch < 0.55  # tokenising does not scale
    capped = plan_time_budget(10_000.0, spent_s=10.0, may_cut_epochs=False, **ARGS)
    assert capped.samples_per_epoch == 6000  # never more than the data


def test_dynamic_runs_fewer_epochs_where_a_static_subset_is_refused():
    # room for about 8 x 12 sample-epochs: below one sample per cluster per epoch for 12 epochs
    target = 10.0 + TM.fixed_s() + 100 * TM.sample_epoch_s(100.0) + 0.05
    plan = plan_time_budget(target, spent_s=10.0, may_cut_epochs=True, **ARGS)
    assert plan.samples_per_epoch >= 16 and 1 <= plan.epochs < 12
    e = plan.epochs  # the epochs chosen, then as many samples as fit in them
    m = plan.samples_per_epoch
    assert 10.0 + TM.allocate_s(m + 1) + TM.train_s(m + 1, e, 100.0) > target
    assert plan.planned_end_to_end_s <= target
    with pytest.raises(TimeBudgetError):
        plan_time_budget(target, spent_s=10.0, may_cut_epochs=False, **ARGS)


@pytest.mark.parametrize("requested,cut", [(0.01, False), (0.01, True), (12.0, False), (12.0, True)])
def test_a_budget_that_cannot_be_met_names_the_smallest_that_fits(requested, cut):
    with pytest.raises(TimeBudgetError) as err:
        plan_time_budget(requested, spent_s=11.0, may_cut_epochs=cut, **ARGS)
    msg = str(err.value)
    assert "select.time_budget" in msg and "already took 11.0 s" in msg
    shown = float(re.search(r"smallest time budget that fits is ([0-9.]+)", msg).group(1))
    plan = plan_time_budget(shown, spent_s=11.0, may_cut_epochs=cut, **ARGS)  # rounded up: it fits
    assert plan.samples_per_epoch >= 16 and plan.epochs <= 12
    step = 0.0001 if requested <= 1 else 0.1  # the printed precision
    with pytest.raises(TimeBudgetError):
        plan_time_budget(shown - step, spent_s=11.0, may_cut_epochs=cut, **ARGS)
