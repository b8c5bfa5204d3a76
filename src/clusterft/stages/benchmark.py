"""Stage `make-benchmark`: the built-in skill mixture written as three JSONL splits under
<artifacts>/benchmark/ (where data.* point by default)."""

from __future__ import annotations

import time
from typing import Any

from clusterft.core.benchmark import generate
from clusterft.io.artifacts import write_json
from clusterft.io.examples import write_jsonl
from clusterft.spec.stages import builtin_data_path, stage


def run_make_benchmark(cfg: Any) -> dict:
    """Stage `make-benchmark`: writes the three splits and the skill sizes."""
    start = time.perf_counter()
    splits = generate(cfg.benchmark)
    for name in ("train", "validation", "test"):
        write_jsonl(builtin_data_path(cfg, name), splits[name])
    sizes: dict[str, int] = {}
    for r in splits["train"]:
        sizes[r["skill"]] = sizes.get(r["skill"], 0) + 1
    metrics = {"splits": {k: len(v) for k, v in splits.items()}, "train_skill_sizes": sizes,
               "head_to_rarest": max(sizes.values()) / min(sizes.values()),
               "wall_clock_s": time.perf_counter() - start}
    write_json(stage("make-benchmark").metrics_path(cfg), metrics)
    return metrics
