import json


def test_pipeline_evaluation_scores_every_test_skill(tiny_run):
    cfg = tiny_run["cfg"]
    ev = json.loads((cfg.artifact("methods", "full") / "eval.json").read_text())
    skills = {json.loads(l)["skill"] for l in open(cfg.data.test)}
    assert set(ev["exact_match"]) == skills
    assert 0.0 <= ev["macro_exact_match"] <= 1.0 and ev["heldout_loss"] > 0
    assert set(ev["heldout_loss_by_skill"]) <= skills
