"""Training step time of a profile's real setup (its model, LoRA, data, batch, 2 gloo ranks),
full logits over whole rows against the fast loss (train.fast_loss: the output layer at answer
positions only, the shared prompt run once per micro-batch), in fp32 and bf16, side by side
on the same random samples; with each setting's losses, which must agree.

    .venv/bin/python benchmarks/bench_train_step.py --params profiles/smollm2-redundant.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from clusterft.orchestration.launch import torchrun_command


def _name(precision: str, fast: bool) -> str:
    return f"{precision}, {'fast loss' if fast else 'full logits'}"


SETTINGS = {_name(p, f): {"precision": p, "fast_loss": f} for p in ("fp32", "bf16") for f in (False, True)}
BASELINE = _name("fp32", False)  # the path of runs recorded before 2026-12-07


def one(params: str, options: dict, steps: int) -> dict | None:
    """`steps` steps of the profile's training on the same random samples; rank 0's timings."""
    import numpy as np

    from clusterft.core.allocation import build_plan
    from clusterft.core.tokens import encode_all
    from clusterft.runtime import distributed, parallel
    from clusterft.runtime.data import load_examples
    from clusterft.runtime.loop import train_on_plan
    from clusterft.runtime.model import build_model
    from clusterft.spec.config import load_config

    cfg = load_config(params, [f"train.{k}={v}" for k, v in options.items()])
    info = distributed.init_distributed()
    model, tokenizer = build_model(cfg, info.device)
    examples = load_examples(cfg, "train")
    per_rank = cfg.train.per_device_batch
    rows = np.random.default_rng(0).permutation(len(examples))[: per_rank * info.world_size * steps]
    encoded = encode_all([examples[r] for r in rows], tokenizer, cfg.data.max_length)
    model = parallel.wrap(model, cfg.train.strategy, info, cfg.train.precision)
    plan = build_plan(np.full(len(rows), -1), info.world_size, per_rank, 1, 0, "shuffle")
    t = cfg.train.model_copy(update={"epochs": 1, "log_every": 10**9, "checkpoint_every": 0})
    hist = train_on_plan(model, encoded, np.ones(len(rows)), plan, t, info, tokenizer.pad_token_id)
    tail = hist[2:] or hist  # the first steps also allocate the optimizer state and check the fast path
    out = {"compute_s": float(np.mean([h["compute_s"] for h in tail])),
           "step_s": float(np.mean([h["step_s"] for h in tail])),
           "tokens_per_s": sum(h["tokens"] for h in tail) / sum(h["compute_s"] for h in tail),
           "losses": [h["weighted_loss"] for h in hist]}
    distributed.cleanup()
    return out if info.is_main else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default="profiles/smollm2-redundant.yaml")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child process: one setting
    args = ap.parse_args()
    if args.one is not None:
        res = one(args.params, dict(SETTINGS[args.one]), args.steps)
        if os.environ.get("RANK", "0") == "0":
            print(json.dumps(res))
        return
    rows = {}
    for name in SETTINGS:
        out = subprocess.run([*torchrun_command(2, [])[:-2], __file__, "--params", args.params,
                              "--steps", str(args.steps), "--one", name], capture_output=True, text=True, check=True)
        rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"[train-step] {name}: {rows[name]['compute_s']:.3f} s compute a step", file=sys.stderr, flush=True)
    base = rows[BASELINE]
    print(f"\n{args.params}: {args.steps} steps, 2 gloo ranks (rank 0's steps after the first 2)\n")
    print("| setting | compute s/step | step s | vs fp32 full logits | tokens/s | max loss diff vs full logits |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        ref = rows[_name(SETTINGS[name]["precision"], False)]  # same precision, full logits
        diff = max(abs(a - b) for a, b in zip(r["losses"], ref["losses"]))
        print(f"| {name} | {r['compute_s']:.3f} | {r['step_s']:.3f} | {base['step_s'] / r['step_s']:.2f}x faster | "
              f"{r['tokens_per_s']:.0f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
