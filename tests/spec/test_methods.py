"""The method table: which selection stages a method pays for, and which budget it takes."""

import pytest

from clusterft.spec.methods import METHODS, method, paid_stages, time_budgeted
from clusterft.spec.stages import STAGES


def test_paid_stages_add_the_probe_only_under_a_time_budget_it_plans():
    assert paid_stages("cluster") == ("warmup", "features", "cluster")
    assert paid_stages("cluster", 0.3) == ("warmup", "features", "cluster", "probe")
    assert paid_stages("random", 0.3) == ("probe",) and paid_stages("random") == ()
    assert paid_stages("full", 0.3) == () and paid_stages("cluster_paper", 0.3) == ("warmup", "features")
    assert not time_budgeted("infobatch", 0.3) and not time_budgeted("cluster", 0.0)


def test_every_needed_stage_is_a_selection_stage_of_the_table():
    selection = {s.name for s in STAGES if s.selection}
    for m in METHODS.values():
        assert set(paid_stages(m.name, 0.5)) <= selection, m.name


def test_an_unknown_method_names_the_known_ones():
    with pytest.raises(KeyError, match="known: full, random"):
        method("oracle")
