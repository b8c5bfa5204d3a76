"""Registry of pipeline stages: name -> library function, shared by the CLI and the flow."""

from __future__ import annotations

from typing import Any, Callable


def stage_functions() -> dict[str, Callable[..., Any]]:
    """Imported lazily so `clusterft --help` stays fast."""
    from clusterft.allocation import run_allocate
    from clusterft.benchmark import run_make_benchmark
    from clusterft.clustering import run_cluster
    from clusterft.compare import run_compare
    from clusterft.evaluate import run_evaluate
    from clusterft.features import run_features
    from clusterft.model import run_prepare_model
    from clusterft.selection import run_select
    from clusterft.train import run_train
    from clusterft.warmup import run_warmup

    return {
        "make-benchmark": run_make_benchmark, "prepare-model": run_prepare_model,
        "warmup": run_warmup, "features": run_features, "cluster": run_cluster,
        "select": run_select, "allocate": run_allocate, "train": run_train,
        "evaluate": run_evaluate, "compare": run_compare,
    }
