"""Choose selection settings on the validation split: `cluster` at one budget and seed under
each variant (feature model/kind, alpha, within-cluster rule), next to `random` at the same
budget, scored by exact match on validation only (the test split is left for the report).

    .venv/bin/python benchmarks/sweep_validation.py --params profiles/smollm2.yaml --budget 0.3
    .venv/bin/python benchmarks/sweep_validation.py --params profiles/smollm2.yaml --base-features minilm

Each variant is a real experiment-grid run (select, allocate, torchrun training, evaluation)
in its own artifacts folder under <artifacts>/sweep/.
"""

from __future__ import annotations

import argparse
import logging

VARIANTS = (  # (name, overrides); the first is the reference the others change one thing of
    ("reference: embedding, alpha 0.5, kcenter, dedup", []),
    ("proxy loss_traj (S2L)", ["features.kind=loss_traj"]),
    ("MiniLM-L6 embedding", ["features.model=minilm"]),
    ("alpha 1.0 (unbiased weights)", ["select.alpha=1.0"]),
    ("alpha 0 (balanced weights)", ["select.alpha=0.0"]),
    ("within far (the paper's rule)", ["select.within=far"]),
    ("within random", ["select.within=random"]),
    ("no dedup", ["select.dedup=false"]),
    ("split power (quota ~ sqrt n_k)", ["select.split=power", "select.tau=0.5"]),
)
BASE = ["features.kind=embedding", "select.alpha=0.5", "select.within=kcenter", "select.dedup=true"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default="profiles/smollm2.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--budget", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="';'-separated variant names (default: all; the reference always runs)")
    ap.add_argument("--base-features", choices=("proxy", "minilm"), default="proxy",
                    help="feature model of the reference variant the others change one thing of")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_feature_models import minilm_dir

    from clusterft.orchestration.experiment import run_experiment
    from clusterft.spec.config import load_config

    root = load_config(args.params, args.overrides).artifact("sweep")
    grid = [f"experiment.budgets=[{args.budget}]", f"experiment.seeds=[{args.seed}]",
            "experiment.zero_shot=false", "evaluate.split=validation"]
    only = {s.strip() for s in args.only.split(";") if s.strip()}
    rows = []
    for i, (name, variant) in enumerate(VARIANTS):
        if only and name not in only and i > 0:  # the reference (and random) always run
            continue
        variant = [v.replace("=minilm", f"={minilm_dir()}") for v in variant]
        methods = "[random, cluster]" if i == 0 else "[cluster]"
        base = [*BASE, f"features.model={minilm_dir() if args.base_features == 'minilm' else 'proxy'}"]
        sets = [*args.overrides, *base, *variant, *grid, f"experiment.methods={methods}",
                f"paths.artifacts={root / args.base_features / f'v{i}'}"]
        print(f"[sweep] {name} (base features: {args.base_features})", flush=True)
        for a in run_experiment(args.params, sets, progress=False)["aggregate"]:
            rows.append([name if a["method"] == "cluster" else "random (reference)",
                         f"{a['selection_s']:.1f}", f"{a['train_s']:.1f}", f"{a['kept_fraction']:.1%}",
                         f"{a['macro_em']:.3f}", f"{a['worst_skill_em']:.3f}"])
    head = ["variant", "selection s", "train s", "kept", "validation macro EM", "validation worst skill"]
    print(f"\n## Validation sweep: budget {args.budget}, seed {args.seed}\n")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
