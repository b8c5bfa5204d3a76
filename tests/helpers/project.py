"""A tiny project (built-in benchmark and model) with its first stages run in this process."""

from __future__ import annotations

from pathlib import Path

from clusterft.orchestration.launch import stage_functions
from clusterft.spec.config import load_config
from tests.conftest import tiny_params, write_params


def prepared(tmp_path: Path, update=None, upto=("make-benchmark", "prepare-model")):
    """params.yaml (tiny_params, changed by `update`) and its config, with the stages `upto`
    already run (select and allocate for method full)."""
    p = tiny_params(tmp_path)
    if update:
        update(p)
    params = write_params(tmp_path, p)
    cfg = load_config(params)
    fns = stage_functions()
    for name in upto:
        fns[name](cfg, "full") if name in ("select", "allocate") else fns[name](cfg)
    return params, cfg
