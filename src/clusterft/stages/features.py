"""Stage `features`: one feature vector per train sample, computed in resumable shards over
the torchrun workers (features.nproc): each rank computes its share of the missing shards,
rank 0 merges them into features/features.npy with a manifest. A killed run recomputes only
the shards it had not saved; shards made under another spec (data, model, kind) are dropped.
"""

from __future__ import annotations

import hashlib
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from clusterft.core.features import Extractor, build_extractor, lift_to_sphere
from clusterft.core.tokens import Encoded
from clusterft.io.artifacts import file_digest, load_npy, read_json, save_npy, write_json
from clusterft.io.moments import MOMENTS_FILE, load_adam_moments, state_dir
from clusterft.io.shards import (
    merge_shards,
    missing_shards,
    prepare_shard_dir,
    remove_shard_dir,
    shard_path,
    shard_ranges,
)
from clusterft.runtime.data import load_examples
from clusterft.runtime.distributed import barrier, cleanup, init_distributed, sum_over_ranks
from clusterft.runtime.features import encode_for, extract, load_feature_model
from clusterft.runtime.model import base_model_dir

FEATURES_TIMEOUT_S = 24 * 3600  # ranks with fewer shards wait this long at the barrier
SPEC_KEYS = ("model", "kind", "dim", "projection", "seed", "precondition", "shard_size")  # change results


def _digest_encoded(encoded: list[Encoded]) -> str:
    """Hash of every sample's id, tokens and label mask (data, template, tokenizer, length)."""
    h = hashlib.sha1()
    for e in encoded:
        h.update(repr((e.id, e.input_ids, e.labels)).encode())
    return h.hexdigest()


def _digest_folder(folder: Path, content: bool) -> str:
    """Hash of a folder's files: their bytes (small adapters) or name/size/mtime (big models)."""
    h = hashlib.sha1()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        st = f.stat()
        h.update(f"{f.relative_to(folder)}:{st.st_size}".encode())
        h.update(f.read_bytes() if content else str(st.st_mtime_ns).encode())
    return h.hexdigest()


def shard_spec(fcfg: Any, dim: int, encoded: list[Encoded], depends_on: list[Path],
               precision: str = "fp32") -> dict:
    """What shards depend on; shards made under another spec are discarded. Small folders
    (adapters, proxies, snapshots) are hashed by content, big ones by name/size/mtime."""
    def digest(p: Path) -> str:
        if not p.is_dir():
            return str(p)
        small = sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) < 64 << 20
        return _digest_folder(p, content=small)

    return {"features": {k: getattr(fcfg, k) for k in SPEC_KEYS}, "precision": precision, "dim": dim,
            "n": len(encoded),
            "data": _digest_encoded(encoded), "depends_on": {str(p): digest(p) for p in depends_on}}


def compute_shards(ext: Extractor, encoded: list[Encoded], todo: list[int],
                   ranges: list[tuple[int, int]], folder: Path, pad_id: int, batch_size: int,
                   device: torch.device, rank: int = 0, precision: str = "fp32") -> int:
    """Compute and atomically save shards `todo`; returns the number of samples computed."""
    total = sum(ranges[i][1] - ranges[i][0] for i in todo)
    with tqdm(total=total, desc=f"features[rank {rank}]", unit="sample", position=rank,
              dynamic_ncols=True) as bar:
        for i in todo:
            start, stop = ranges[i]
            feats = extract(ext, encoded[start:stop], pad_id, batch_size, device, bar, precision)
            save_npy(shard_path(folder, i, ranges[i]), feats)
    return total


def run_features(cfg: Any) -> dict:
    """Stage `features`: features/features.npy [N, D] float32, manifest.json, metrics.json.

    Under torchrun every rank computes its share of the missing shards; without it the
    process is a world of one. Returns the metrics (on every rank)."""
    start = time.perf_counter()
    owns_group = not (dist.is_available() and dist.is_initialized())
    info = init_distributed(timeout_s=FEATURES_TIMEOUT_S)
    try:
        return _run_features(cfg, info, start)
    finally:
        if owns_group:
            cleanup()


def feature_precision(cfg: Any) -> str:
    """train.precision, except fp32 for lora_grad under fp16: its per-sample backward has no
    loss scaling, so fp16 gradients could underflow (bf16 has fp32's range)."""
    p = cfg.train.precision
    return "fp32" if p == "fp16" and cfg.features.kind == "lora_grad" else p


def _run_features(cfg: Any, info: Any, start: float) -> dict:
    """Shard plan -> this rank's missing shards -> rank 0 merges (see run_features)."""
    fcfg = cfg.features
    fmodel = load_feature_model(cfg, info.device)
    examples = load_examples(cfg, "train", fmodel.render)
    encoded = encode_for(fmodel, examples)
    tokenizer = fmodel.tokenizer
    moments = partial(load_adam_moments, state_dir(cfg) / "adapter" / MOMENTS_FILE)
    ext = build_extractor(fmodel.model, fcfg, moments, info.device)
    out = cfg.artifact("features")
    folder, ranges = out / "shards", shard_ranges(len(encoded), fcfg.shard_size)
    if info.is_main:
        prepare_shard_dir(folder, shard_spec(fcfg, ext.dim, encoded, fmodel.depends_on, feature_precision(cfg)))
    barrier()
    todo = missing_shards(folder, ranges, ext.dim)
    barrier()  # every rank listed the same missing shards before any is written
    mine = todo[info.rank :: info.world_size]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    n_done = compute_shards(ext, encoded, mine, ranges, folder, pad_id,
                            fcfg.batch_size, info.device, info.rank, feature_precision(cfg))
    samples, shards = sum_over_ranks([n_done, len(mine)], info.device)
    if info.is_main:
        stats = {"samples_computed": samples, "shards_computed": shards,
                 "shards_reused": len(ranges) - shards, "n_shards": len(ranges),
                 "world_size": info.world_size, **ext.info}
        _finish(cfg, ext.dim, ranges, [e.id for e in examples], stats, start)
    barrier()
    return read_json(out / "metrics.json")


def _finish(cfg: Any, dim: int, ranges: list[tuple[int, int]], ids: list[str], stats: dict,
            start: float) -> None:
    """Rank 0: merge shards into features.npy, write manifest + metrics, drop the shards.

    wall_clock_s is this run's (model loading included); samples_per_s counts only the
    samples this run computed, over all ranks."""
    fcfg, out = cfg.features, cfg.artifact("features")
    merge_shards(out / "shards", ranges, dim, out / "features.npy")
    if fcfg.kind == "loss_traj":  # the sphere lift needs every row's norm: done after the merge
        lifted = lift_to_sphere(load_npy(out / "features.npy"))
        save_npy(out / "features.npy", lifted)
        dim = lifted.shape[1]
    seconds = time.perf_counter() - start
    manifest = {
        "kind": fcfg.kind, "n": len(ids), "dim": dim, "features_model": fcfg.model,
        "target_model": str(base_model_dir(cfg)), "ids": ids, "data_digest": file_digest(cfg.data.train),
        "params": {k: getattr(fcfg, k) for k in SPEC_KEYS}, "normalised": False,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_clock_s": seconds, "samples_per_s": stats["samples_computed"] / seconds, **stats,
    }
    write_json(out / "manifest.json", manifest)
    write_json(out / "metrics.json", {k: v for k, v in manifest.items() if k != "ids"})
    remove_shard_dir(out / "shards")
