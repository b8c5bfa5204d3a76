import json

from clusterft.data import Example
from clusterft.evaluate import exact_match


def test_exact_match_per_skill_macro_and_worst():
    ex = [Example("1", "p", "a b", "copy"), Example("2", "p", "b a", "copy"),
          Example("3", "p", "7", "add"), Example("4", "p", "x", None)]
    m = exact_match(ex, [" a  b ", "a b", "8", "x"])
    assert m["exact_match"] == {"add": 0.0, "all": 1.0, "copy": 0.5}
    assert m["macro_exact_match"] == 0.5 and m["worst_skill"] == "add"
    assert m["micro_exact_match"] == 0.5


def test_pipeline_evaluation_scores_every_test_skill(tiny_run):
    cfg = tiny_run["cfg"]
    ev = json.loads((cfg.artifact("methods", "full") / "eval.json").read_text())
    skills = {json.loads(l)["skill"] for l in open(cfg.data.test)}
    assert set(ev["exact_match"]) == skills
    assert 0.0 <= ev["macro_exact_match"] <= 1.0 and ev["heldout_loss"] > 0
    assert set(ev["heldout_loss_by_skill"]) <= skills
