"""Exact match per skill, its macro mean and the worst skill."""

from clusterft.core.scoring import exact_match
from clusterft.core.tokens import Example


def test_exact_match_per_skill_macro_and_worst():
    ex = [Example("1", "p", "a b", "copy"), Example("2", "p", "b a", "copy"),
          Example("3", "p", "7", "add"), Example("4", "p", "x", None)]
    m = exact_match(ex, [" a  b ", "a b", "8", "x"])
    assert m["exact_match"] == {"add": 0.0, "all": 1.0, "copy": 0.5}
    assert m["macro_exact_match"] == 0.5 and m["worst_skill"] == "add"
    assert m["micro_exact_match"] == 0.5
