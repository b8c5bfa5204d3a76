"""A fixed uneven plan over 4 weighted samples: 3 steps for 2 ranks (3 + 1 samples, then
1 + 2, then 2 + none), and the same global steps for a single process."""

import numpy as np

from clusterft.core.allocation import AllocationPlan
from clusterft.core.tokens import IGNORE_INDEX, Encoded

CASE_WEIGHTS = [0.5, 2.0, 1.0, 0.5]
CASE_STEPS = [([0, 1, 2], [3]), ([3], [0, 2]), ([1, 0], [])]  # per step: (rank 0's, rank 1's) samples


def case_plan(world_size: int) -> AllocationPlan:
    """The case's steps for 2 ranks, or merged into one rank (same global steps)."""
    rows = [(0, s, r if world_size > 1 else 0, i)
            for s, shares in enumerate(CASE_STEPS) for r, share in enumerate(shares) for i in share]
    table = np.array(sorted(rows, key=lambda r: (r[0], r[1], r[2])), dtype=np.int64)
    return AllocationPlan(table, world_size, 1, len(CASE_STEPS))


def case_samples(system: tuple[int, ...] = ()) -> list[Encoded]:
    """4 samples of 3 to 6 tokens, 2 prompt tokens each, behind a shared `system` prompt."""
    seqs = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18], [19, 20, 21, 22]]
    out = []
    for i, s in enumerate(seqs):
        labels = [IGNORE_INDEX] * (len(system) + 2) + s[2:]
        out.append(Encoded(id=str(i), input_ids=[*system, *s], labels=labels))
    return out
