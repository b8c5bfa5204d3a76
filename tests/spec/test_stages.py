"""The stage and method tables are the one declaration every entry point reads: the
committed DVC files are generated from them, the CLI offers exactly their stages, and each
entry names real code."""



from clusterft.cli import build_parser
from clusterft.orchestration.launch import resolve
from clusterft.spec.config import load_config
from clusterft.spec.methods import METHODS
from clusterft.spec.stages import STAGES


def test_cli_offers_every_stage_and_method():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert {s.name for s in STAGES} <= set(sub.choices)
    assert all(m in sub.choices["select"].format_help() for m in METHODS)


def test_every_stage_names_real_functions_and_params():
    cfg = load_config(None)
    for s in STAGES:
        assert callable(resolve(s.func)), s.name
        if s.preflight:
            assert callable(resolve(s.preflight)), s.name
        for key in filter(None, (s.workers, s.restarts, s.when)):
            cfg.value(key)  # an AttributeError names a param the table invented






def test_method_table_drives_the_grid_budgets():
    from clusterft.spec.grid import RunSpec, grid

    specs = grid(list(METHODS), [0.2, 0.4], [0])
    for m in METHODS.values():
        mine = [s for s in specs if s.method == m.name]
        assert len(mine) == (1 if m.budget is None else 2)
        if m.budget:
            assert f"{m.budget}=0.2" in RunSpec(m.name, 0.2, 0).overrides()
    for m in METHODS.values():
        assert set(m.needs) <= {s.name for s in STAGES if s.selection}
