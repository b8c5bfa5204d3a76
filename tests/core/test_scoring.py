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


def test_may_still_match_is_a_prefix_whitespace_aside_as_exact_match_scores():
    from clusterft.core.scoring import may_still_match, normalise_answer

    assert may_still_match("New  Y", "New York") and may_still_match("", "x") and may_still_match("a b", " a b ")
    assert not may_still_match("New T", "New York") and not may_still_match("a b c", "a b")
    # an answer that matches by exact match may still match from any of its starts
    assert all(may_still_match(" New York "[:k], normalise_answer("New   York")) for k in range(11))
