"""Accuracy-versus-time curves: evaluation steps, time to target, a curve read at a time,
saturation."""

import pytest

from clusterft.core.curves import eval_steps, saturated, saturation_step, time_to_target, value_at


@pytest.mark.parametrize("total, every, want", [
    (10, 0, []), (10, 3, [3, 6, 9, 10]), (10, 0.25, [3, 5, 8, 10]), (386, 0.25, [97, 193, 290, 386]), (10, 1, [10]),
    (10, 0.5, [5, 10]), (3, 100, [3]), (7, 0.01, [1, 2, 3, 4, 5, 6, 7]), (0, 0.5, []),
])
def test_eval_steps_every_count_or_fraction_and_always_the_last(total, every, want):
    assert eval_steps(total, every) == want


def test_time_to_target_is_the_first_point_that_reaches_it():
    pts = [(30.0, 0.7), (10.0, 0.2), (20.0, 0.61), (40.0, 0.5)]
    assert time_to_target(pts, 0.6) == 20.0
    assert time_to_target(pts, 0.71) is None
    assert time_to_target([], 0.1) is None


def test_a_curve_is_read_between_its_points_and_holds_after_its_end():
    pts = [(10.0, 0.2), (20.0, 0.6)]
    assert value_at(pts, 15.0) == pytest.approx(0.4)
    assert value_at(pts, 10.0) == 0.2
    assert value_at(pts, 5.0) is None  # never measured before its first point
    assert value_at(pts, 99.0) == 0.6  # the run had stopped: its last value
    assert value_at([], 1.0) is None


def test_saturation_from_the_point_the_curve_stays_near_its_end():
    flat = [(10, 0.50), (20, 0.795), (30, 0.80), (40, 0.79), (50, 0.80)]
    assert saturation_step(flat) == 20 and saturated(flat, 50) is True
    rising = [(10, 0.5), (20, 0.6), (30, 0.7), (40, 0.75), (50, 0.8)]
    assert saturation_step(rising) == 50 and saturated(rising, 50) is False
    dip = [(10, 0.8), (20, 0.6), (30, 0.8), (40, 0.8)]  # left the band once: counts from its return
    assert saturation_step(dip) == 30 and saturated(dip, 40) is False
    assert saturated([(5, 0.5)], 5) is None
