"""A fixed uneven step: rank 0 trains 3 samples, rank 1 trains 1, with unequal weights."""

from clusterft.data import IGNORE_INDEX, Encoded

CASE_PLAN = [[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 1, 3]]
CASE_WEIGHTS = [0.5, 2.0, 1.0, 0.5]


def case_samples() -> list[Encoded]:
    seqs = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18], [19, 20, 21, 22]]
    out = []
    for i, s in enumerate(seqs):
        labels = [IGNORE_INDEX] * 2 + s[2:]
        out.append(Encoded(id=str(i), input_ids=s, labels=labels))
    return out
