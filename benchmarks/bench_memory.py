"""Peak memory and tokens/s of one training configuration per process, side by side:
fp32 + AdamW (the baseline) against bf16, activation checkpointing, Adafactor, micro-batches
and all of them together, and DDP against FSDP on 2 gloo ranks (same global batch; the peak
of the larger rank), on one local HF model (full fine-tuning, where optimizer state counts).
Each setting runs in fresh processes, since peak RSS only grows.

    .venv/bin/python benchmarks/bench_memory.py --model artifacts-smollm2/model
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from clusterft.orchestration.launch import torchrun_command

SETTINGS = {  # name: train_on_plan options (and model-side switches)
    "fp32 + AdamW (baseline)": {},
    "bf16 autocast": {"precision": "bf16"},
    "activation checkpointing": {"checkpointing": True},
    "Adafactor": {"optimizer": "adafactor"},
    "grad_accum 4": {"grad_accum": 4},
    "bf16 + checkpointing + Adafactor + grad_accum 4": {"precision": "bf16", "checkpointing": True,
                                                         "optimizer": "adafactor", "grad_accum": 4},
    "DDP, 2 ranks (per rank)": {"strategy": "ddp"},
    "FSDP, 2 ranks (per rank)": {"strategy": "fsdp"},
}


def one(model_dir: str, options: dict, batch: int, length: int, steps: int) -> dict:
    """Train `steps` steps of `batch` random sequences of `length` tokens; peak memory, tokens/s."""
    import numpy as np
    import torch

    from clusterft.core.allocation import build_plan
    from clusterft.core.tokens import Encoded
    from clusterft.runtime import distributed, parallel
    from clusterft.runtime.loop import make_optimizer, train_on_plan
    from clusterft.runtime.model import load_model
    from clusterft.runtime.precision import peak_memory_mb
    from clusterft.spec.config import TrainConfig

    info = distributed.init_distributed()
    torch.manual_seed(0)
    model = load_model(model_dir)
    if options.pop("checkpointing", False):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = parallel.wrap(model, options.pop("strategy", "ddp"), info, options.get("precision", "fp32"))
    opt = make_optimizer(options.pop("optimizer", "adamw"), list(model.parameters()), 1e-5, 0.0)
    rng = np.random.default_rng(0)
    vocab = parallel.unwrap(model).config.vocab_size
    data = [Encoded(str(i), ids := rng.integers(0, vocab, length).tolist(), ids) for i in range(batch * steps)]
    plan = build_plan(np.full(len(data), -1), info.world_size, batch // info.world_size, 1, 0, "shuffle")
    loaded = peak_memory_mb(torch.device("cpu"))
    hist = train_on_plan(model, data, np.ones(len(data)), plan, TrainConfig(lr=1e-5, log_every=10**6, **options),
                         info, optimizer=opt)
    tail = hist[1:] or hist  # the first step also allocates the optimizer state
    mine = {"peak_mem_mb": peak_memory_mb(torch.device("cpu")), "after_load_mb": loaded,
            "tokens_per_s": info.world_size * sum(h["tokens"] for h in tail) / sum(h["compute_s"] for h in tail)}
    if info.world_size == 1:
        return mine
    ranks = [None] * info.world_size
    torch.distributed.all_gather_object(ranks, mine)
    distributed.cleanup()
    worst = max(ranks, key=lambda r: r["peak_mem_mb"])  # tokens/s: both ranks together
    return {**worst, "tokens_per_s": min(r["tokens_per_s"] for r in ranks)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="artifacts-smollm2/model")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child process: one setting
    args = ap.parse_args()
    if args.one is not None:
        res = one(args.model, dict(SETTINGS[args.one]), args.batch, args.length, args.steps)
        if os.environ.get("RANK", "0") == "0":
            print(json.dumps(res))
        return
    rows = {}
    for name in SETTINGS:
        launcher = [sys.executable]
        if "strategy" in SETTINGS[name]:
            launcher = torchrun_command(2, [])[:-2]  # torchrun, 2 ranks, running this file
        out = subprocess.run([*launcher, __file__, "--model", args.model, "--batch", str(args.batch),
                              "--length", str(args.length), "--steps", str(args.steps), "--one", name],
                             capture_output=True, text=True, check=True)
        rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"[memory] {name}: {rows[name]}", file=sys.stderr, flush=True)
    base = rows["fp32 + AdamW (baseline)"]
    print(f"\n{args.model}, full fine-tuning, batch {args.batch} x {args.length} tokens, {args.steps} steps\n")
    print("| setting | peak memory MB | vs baseline | training tokens/s | vs baseline |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['peak_mem_mb']:.0f} | {r['peak_mem_mb'] / base['peak_mem_mb']:.2f}x | "
              f"{r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base['tokens_per_s']:.2f}x |")


if __name__ == "__main__":
    main()
