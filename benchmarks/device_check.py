"""GPU figures for issue 13, on SmolLM2-135M (its pretrained weights when MODEL has them,
else the same architecture with random weights: speed does not depend on the weights).

    python benchmarks/device_check.py features     # per-sample LoRA gradients: batched vs loop
    python benchmarks/device_check.py throughput   # training tokens/s: fp32 vs bf16

benchmarks/device_check.sh runs both and the time-to-accuracy run; `--model` picks a local
HF folder, `--tiny` a 2-layer model (the test's quick check of this script on CPU).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from clusterft.core.tokens import Encoded, collate
from clusterft.runtime.model import add_lora, load_model
from clusterft.spec.config import LoraConfig

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                    max_position_embeddings=2048)
TINY = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=128)


def model_for(args: argparse.Namespace, device: torch.device) -> tuple[torch.nn.Module, str]:
    """The pretrained model at --model when it exists, else random weights of the same shape."""
    if not args.tiny and (Path(args.model) / "config.json").exists():
        return load_model(args.model).to(device), f"{args.model} (pretrained)"
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    shape = TINY if args.tiny else SMOLLM2_135M
    return LlamaForCausalLM(LlamaConfig(**shape)).to(device), ("tiny" if args.tiny else "SmolLM2-135M") + \
        " architecture, random weights"


def samples(n: int, length: int, vocab: int, seed: int = 0) -> list[Encoded]:
    """Random sequences of 1/2..1x `length` tokens, the second half of each is the response."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ids = rng.integers(0, vocab, int(rng.integers(length // 2, length + 1))).tolist()
        out.append(Encoded(str(i), ids, [-100] * (len(ids) // 2) + ids[len(ids) // 2:]))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def features(args: argparse.Namespace, device: torch.device) -> None:
    from clusterft.core.lora_grads import PerSampleLoraGrads, loop_per_sample_grads

    model, name = model_for(args, device)
    model = add_lora(model, LoraConfig()).eval()
    data = samples(args.samples, args.length, model.config.vocab_size)
    grads = PerSampleLoraGrads(model)
    batches = [{k: v.to(device) for k, v in collate(data[i:i + args.batch], 0).items()}
               for i in range(0, len(data), args.batch)]
    grads(batches[0])  # warm-up (kernels, allocator)
    _sync(device)
    t = time.perf_counter()
    for b in batches:
        fast = grads(b)
    _sync(device)
    batched = len(data) / (time.perf_counter() - t)
    n_loop = max(1, args.samples // 8)
    t = time.perf_counter()
    loop = loop_per_sample_grads(model, batches[-1] if n_loop >= len(data) else
                                 {k: v[:n_loop] for k, v in batches[-1].items()})
    _sync(device)
    looped = loop.shape[0] / (time.perf_counter() - t)
    err = float(((fast[:loop.shape[0]] - loop).norm(dim=1) / loop.norm(dim=1)).max())
    print(f"per-sample LoRA gradients, {name}, {device}, length <= {args.length}: batched "
          f"{batched:.1f} samples/s (batch {args.batch}), batch-size-1 loop {looped:.1f} samples/s, "
          f"speed-up {batched / looped:.1f}x (goal >= 10x), max relative difference {err:.1e}")


def throughput(args: argparse.Namespace, device: torch.device) -> None:
    from clusterft.core.allocation import build_plan
    from clusterft.runtime.distributed import DistInfo
    from clusterft.runtime.loop import train_on_plan
    from clusterft.spec.config import TrainConfig

    rates = {}
    for precision in ("fp32", "bf16"):
        model, name = model_for(args, device)
        data = samples(args.batch * (args.steps + 1), args.length, model.config.vocab_size)
        plan = build_plan(np.full(len(data), -1), 1, args.batch, 1, 0, "shuffle")
        t = TrainConfig(lr=1e-5, precision=precision, log_every=10**6)
        hist = train_on_plan(model, data, np.ones(len(data)), plan, t, DistInfo(0, 1, 0, device, None))[1:]  # step 0 warms up
        rates[precision] = sum(h["tokens"] for h in hist) / sum(h["compute_s"] for h in hist)
        del model
    print(f"training tokens/s, {name}, full fine-tuning, {device}, batch {args.batch} x <= {args.length}: "
          f"fp32 {rates['fp32']:.0f}, bf16 {rates['bf16']:.0f}, bf16/fp32 {rates['bf16'] / rates['fp32']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("check", choices=["features", "throughput"])
    ap.add_argument("--model", default="artifacts-smollm2/model")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model: checks the script quickly")
    ap.add_argument("--samples", type=int, default=512, help="samples timed batched (loop: an eighth)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20, help="timed training steps per precision")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    {"features": features, "throughput": throughput}[args.check](args, device)


if __name__ == "__main__":
    main()
