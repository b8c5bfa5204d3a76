"""Stage `prepare-model`: build the built-in tiny model where model.path points at it; with
your own model.path, check its tokenizer (weights are read by the stages that use them) and
leave a note in the built-in folder (a DVC output, so it must exist)."""

from __future__ import annotations

import shutil
import time

from clusterft.io.artifacts import atomic_write_text, ensure_dir, write_json
from clusterft.runtime.data import load_examples
from clusterft.runtime.model import load_tokenizer, prepare_builtin
from clusterft.spec.config import PipelineConfig
from clusterft.spec.stages import builtin_model_path, stage


def run_prepare_model(cfg: PipelineConfig) -> dict:
    """Stage `prepare-model`: writes model/base (or NOT_USED.txt) and model/metrics.json."""
    start = time.perf_counter()
    out = builtin_model_path(cfg)
    if cfg.builtin_model:
        texts = [f"{e.prompt} {e.response}" for e in load_examples(cfg, "train")]
        info = prepare_builtin(cfg, texts, out)
    else:
        load_tokenizer(cfg.model.path, cfg.model)
        if out.exists():
            shutil.rmtree(out)
        atomic_write_text(ensure_dir(out) / "NOT_USED.txt", f"model.path is {cfg.model.path}\n")
        info = {"dir": cfg.model.path, "builtin": False}
    info["wall_clock_s"] = time.perf_counter() - start
    write_json(stage("prepare-model").metrics_path(cfg), info)
    return info
