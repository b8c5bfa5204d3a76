"""Allocation quality on the pipeline's own selection: our balanced plan versus the earlier
per-step plan and a shuffled DistributedSampler, side by side, for 2, 4 and 8 ranks.

Needs a finished pipeline run (artifacts/methods/<method>/selection.jsonl: `dvc repro`) or a
grid run (--run cluster-b0.3-s0: artifacts/experiments/<run>/selection.jsonl).
Usage: python benchmarks/bench_allocation.py [--params params.yaml] [--set key=value] [--method cluster] [--run NAME]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from clusterft.core.allocation import build_plan, plan_metrics
from clusterft.core.tokens import encode_all
from clusterft.io.records import read_selection
from clusterft.runtime.data import load_examples
from clusterft.runtime.model import base_model_dir, load_tokenizer
from clusterft.spec.config import load_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--method", default="cluster")
    ap.add_argument("--run", default=None, help="a grid run's folder under experiments/")
    ap.add_argument("--ranks", default="2,4,8")
    args = ap.parse_args()
    cfg = load_config(args.params, args.overrides)
    sel = read_selection(cfg.method_dir(args.method, args.run) / "selection.jsonl")
    clusters = np.asarray(sel["cluster"])
    examples = load_examples(cfg, "train")
    tok = load_tokenizer(base_model_dir(cfg), cfg.model)
    lengths = np.array([e.n_tokens for e in encode_all([examples[r] for r in sel["row"]], tok, cfg.data.max_length)])
    b = cfg.train.per_device_batch
    print(f"selection: {args.run or args.method}, {len(clusters)} samples, {len(set(clusters))} clusters, "
          f"tokens/sample {lengths.min()}-{lengths.max()} (mean {lengths.mean():.1f}), per-device batch {b}")
    print("| ranks | plan | token imbalance (max/mean) | worst step | padded-cost imbalance | padding fraction "
          "| coverage error (max) | plan drift (samples) | rank x cluster coverage | build s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for world in map(int, args.ranks.split(",")):
        for mode, label in (("balanced", "clusterft"), ("per_step", "clusterft per_step (earlier)"),
                            ("shuffle", "DistributedSampler")):
            t = time.perf_counter()
            plan = build_plan(clusters, world, b, 1, cfg.train.seed, mode, lengths)
            secs = time.perf_counter() - t
            m = plan_metrics(plan, clusters, lengths)
            print(f"| {world} | {label} | {m['token_imbalance_mean']:.3f} | {m['token_imbalance_max']:.3f} "
                  f"| {m['padded_imbalance_mean']:.3f} | {m['padding_fraction']:.3f} | {m['coverage_error_max']:.2f} "
                  f"| {m['prefix_discrepancy_max']:.1f} | {m['rank_cluster_coverage']:.2f} | {secs:.2f} |")


if __name__ == "__main__":
    main()
