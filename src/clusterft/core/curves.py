"""Accuracy-versus-time curves: when to evaluate during a run, the time a curve first
reaches a target (time to target, as MLPerf Training reports it), a curve read at a given
time (full data stopped early) and whether a curve had flattened before its end."""

from __future__ import annotations

import math
from typing import Sequence

TARGET_MARGIN = 0.01  # time to target: full data's final validation macro EM minus 1 point
SATURATED_BY = 0.5  # full data saturates when it is within TARGET_MARGIN of its end by half its steps


def eval_steps(total_steps: int, every: float) -> list[int]:
    """The 1-based optimizer steps a run of `total_steps` is evaluated after: every `every`
    steps (> 1), or at each multiple of the fraction `every` (<= 1) of the run, rounded up (so
    0.25 of 386 steps puts a point at 193, exactly half); the last step always; [] when off."""
    if every <= 0 or total_steps <= 0:
        return []
    if every > 1:
        return sorted({*range(int(every), total_steps + 1, int(every)), total_steps})
    marks = (math.ceil(k * every * total_steps - 1e-9) for k in range(1, int(1 / every + 1e-9) + 1))
    return sorted({*(max(1, m) for m in marks), total_steps})


def time_to_target(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """The first time of (time, value) points whose value reaches `target`; None if none does."""
    return next((t for t, v in sorted(points) if v >= target - 1e-9), None)


def value_at(points: Sequence[tuple[float, float]], t: float) -> float | None:
    """A curve's value at time t: linear between the points that bracket t, its last value
    after its end (the run had stopped), None before its first point (never measured there)."""
    pts = sorted(points)
    if not pts or t < pts[0][0]:
        return None
    for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return pts[-1][1]


def saturation_step(points: Sequence[tuple[int, float]], margin: float = TARGET_MARGIN) -> int | None:
    """The first step of (step, value) points from which the curve stays within `margin` of
    its final value, or None for an empty curve."""
    pts = sorted(points)
    if not pts:
        return None
    final = pts[-1][1]
    first = pts[-1][0]
    for s, v in reversed(pts):
        if abs(v - final) > margin + 1e-9:  # 1 point means 1 point, float rounding aside
            break
        first = s
    return first


def saturated(points: Sequence[tuple[int, float]], total_steps: int, by: float = SATURATED_BY,
              margin: float = TARGET_MARGIN) -> bool | None:
    """True when the curve is within `margin` of its final value by `by` of its steps (more
    steps would not have helped); False when it was still improving; None without points
    before its end (nothing to judge from)."""
    pts = sorted(points)
    if len(pts) < 2:
        return None
    step = saturation_step(pts, margin)
    return step is not None and step <= by * total_steps
