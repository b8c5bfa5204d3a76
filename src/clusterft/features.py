"""Per-sample features, one function per kind, computed in resumable shards over workers.

The model (`features.model`): `target` (base model + warmup LoRA adapter, prompts rendered
as they are trained), `proxy` (the tiny model the warmup trained from scratch; plain
prompt template, its own tokenizer) or a sentence-encoder folder (mean-pooled embedding).
Kinds (`features.kind`):
- lora_grad (default): gradient of the sample's mean response-token loss w.r.t. the LoRA
  weights, exact and batched (clusterft.lora_grads); optionally Adam-preconditioned with
  the warmup moments (LESS); then projected to `features.dim` by a seeded random matrix
  (clusterft.projection). [N, dim], or [N, P] with projection `none`.
- lastlayer: the paper's proxy: for each response token, (p_y - 1) * h_last (final hidden
  state scaled by the loss gradient w.r.t. the true token's logit), averaged over the
  response tokens; one forward pass, no backward. [N, hidden_size].
- embedding: the final hidden state mean-pooled over all non-pad tokens, prompt
  included (the usual sentence-embedding pooling: what the sample says, not how the model
  would learn from it). [N, hidden_size].
- loss_traj (S2L): the sample's mean response-token loss at each warmup snapshot, lifted
  onto a sphere (one extra column) so that the row normalisation clustering applies keeps
  the loss level, not only the curve's shape. [N, snapshots + 1].

Stored rows are NOT L2-normalised: clustering and selection normalise rows themselves, and
the raw norm (e.g. how large a sample's gradient is) stays available.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm import tqdm

from clusterft.data import IGNORE_INDEX, Encoded, collate

log = logging.getLogger(__name__)
MOMENTS_FILE = "adam_moments.safetensors"
FEATURES_TIMEOUT_S = 24 * 3600  # ranks with fewer shards wait this long at the barrier
SPEC_KEYS = ("model", "kind", "dim", "projection", "seed", "precondition", "shard_size")  # change results

Batch = dict[str, torch.Tensor]


@dataclass
class Extractor:
    """A feature kind bound to a model: collated batch -> [B, dim] float32."""

    fn: Callable[[Batch], torch.Tensor]
    dim: int
    info: dict[str, Any] = field(default_factory=dict)  # recorded in the manifest


@torch.no_grad()
def lastlayer_batch(model: Any, batch: Batch) -> torch.Tensor:
    """[B, H] last-layer gradient proxy: mean over response tokens of (p_y - 1) * h."""
    res = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                output_hidden_states=True)
    h = res.hidden_states[-1][:, :-1, :].float()  # state that predicts token t+1
    labels = batch["labels"][:, 1:]
    mask = labels != IGNORE_INDEX
    logp = torch.log_softmax(res.logits[:, :-1, :].float(), dim=-1)
    p_y = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1).exp()
    coef = (p_y - 1.0) * mask
    return (coef.unsqueeze(-1) * h).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)


@torch.no_grad()
def embedding_batch(model: Any, batch: Batch) -> torch.Tensor:
    """[B, H] final hidden state averaged over the non-pad tokens (prompt and response)."""
    res = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                output_hidden_states=True)
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return (res.hidden_states[-1].float() * mask).sum(1) / mask.sum(1).clamp(min=1)


@torch.no_grad()
def loss_traj_batch(models: list[Any], batch: Batch) -> torch.Tensor:
    """[B, S] mean response-token loss of each sample under each of S snapshot models."""
    from clusterft.data import per_sample_loss

    cols = [per_sample_loss(m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                            batch["labels"]) for m in models]
    return torch.stack(cols, 1)


def lift_to_sphere(x: np.ndarray) -> np.ndarray:
    """[N, D] -> [N, D + 1] rows of equal norm (the largest row's): L2 normalisation then
    divides every row by the same number, so the original geometry (levels included) stays."""
    sq = (x.astype(np.float64) ** 2).sum(1)
    extra = np.sqrt(np.maximum(sq.max() - sq, 0.0)) if len(x) else sq
    return np.concatenate([x, extra[:, None].astype(x.dtype)], axis=1)


@torch.no_grad()
def encoder_batch(model: Any, batch: Batch) -> torch.Tensor:
    """[B, H] a sentence encoder's last hidden state mean-pooled over non-pad tokens."""
    res = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return (res.last_hidden_state.float() * mask).sum(1) / mask.sum(1).clamp(min=1)


def _hidden_size(model: Any) -> int:
    return int(model.get_input_embeddings().embedding_dim)


def _lastlayer(model: Any, fcfg: Any, adapter_dir: Path, device: torch.device) -> Extractor:
    return Extractor(partial(lastlayer_batch, model), _hidden_size(model))


def _embedding(model: Any, fcfg: Any, adapter_dir: Path, device: torch.device) -> Extractor:
    if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
        return Extractor(partial(encoder_batch, model), _hidden_size(model))  # an encoder
    return Extractor(partial(embedding_batch, model), _hidden_size(model))


def _loss_traj(model: Any, fcfg: Any, adapter_dir: Path, device: torch.device) -> Extractor:
    """`model` here is the list of snapshot models, oldest first."""
    return Extractor(partial(loss_traj_batch, model), len(model), {"snapshots": len(model)})


@dataclass
class LoraGradPipeline:
    """batch -> per-sample LoRA gradients [B, P] -> Adam preconditioning (optional) ->
    random projection [B, dim] (optional). `grads` is swappable (the benchmark's loop)."""

    grads: Callable[[Batch], torch.Tensor]
    moments: Any = None  # clusterft.lora_grads.AdamMoments
    proj: Any = None  # clusterft.projection.RandomProjection

    def transform(self, g: torch.Tensor) -> torch.Tensor:
        """[B, P] raw gradients -> [B, dim] features."""
        g = self.moments.precondition(g) if self.moments is not None else g
        return self.proj(g) if self.proj is not None else g

    def __call__(self, batch: Batch) -> torch.Tensor:
        return self.transform(self.grads(batch))


def _lora_grad(model: Any, fcfg: Any, adapter_dir: Path, device: torch.device) -> Extractor:
    from clusterft.lora_grads import PerSampleLoraGrads, load_adam_moments
    from clusterft.projection import RandomProjection

    grads = PerSampleLoraGrads(model)
    moments = (load_adam_moments(adapter_dir / MOMENTS_FILE, grads.names).to(device)
               if fcfg.precondition else None)
    proj = (None if fcfg.projection == "none" else
            RandomProjection(grads.n_params, fcfg.dim, fcfg.projection, fcfg.seed,
                             fcfg.projection_cache_mb, device))
    if proj is not None and fcfg.dim >= grads.n_params:
        log.info("features.dim=%d >= %d LoRA weights: projection none would keep the exact "
                 "gradient in fewer columns", fcfg.dim, grads.n_params)
    info = {"n_lora_params": grads.n_params, "n_lora_modules": len(grads.sites),
            "projection_cached": bool(proj is not None and proj.cached)}
    return Extractor(LoraGradPipeline(grads, moments, proj), proj.dim if proj else grads.n_params, info)


FEATURE_BUILDERS: dict[str, Callable[[Any, Any, Path, torch.device], Extractor]] = {
    "lora_grad": _lora_grad, "lastlayer": _lastlayer, "embedding": _embedding, "loss_traj": _loss_traj,
}


def build_extractor(model: Any, fcfg: Any, adapter_dir: str | Path,
                    device: torch.device | str = "cpu") -> Extractor:
    """The extractor of kind `fcfg.kind` (see FEATURE_BUILDERS) on `model` (put in eval mode)."""
    if fcfg.kind not in FEATURE_BUILDERS:
        raise ValueError(f"unknown features.kind {fcfg.kind!r}; known: {sorted(FEATURE_BUILDERS)}")
    for m in model if isinstance(model, list) else [model]:
        m.eval()  # no dropout: deterministic features
    return FEATURE_BUILDERS[fcfg.kind](model, fcfg, Path(adapter_dir), torch.device(device))


def extract(ext: Extractor, encoded: list[Encoded], pad_id: int, batch_size: int,
            device: torch.device | str = "cpu", bar: Any = None, precision: str = "fp32") -> np.ndarray:
    """[n, dim] float32 rows in input order; batches group similar lengths (less padding).
    `precision` (train.precision) autocasts the forwards as training does."""
    from clusterft.train_loop import autocast

    device = torch.device(device)
    order = np.argsort([e.n_tokens for e in encoded], kind="stable")
    out = np.empty((len(encoded), ext.dim), dtype=np.float32)
    for i in range(0, len(order), batch_size):
        idx = order[i : i + batch_size]
        batch = {k: v.to(device) for k, v in collate([encoded[j] for j in idx], pad_id).items()}
        with autocast(precision, device):
            out[idx] = ext.fn(batch).detach().float().cpu().numpy()
        if bar is not None:
            bar.update(len(idx))
    return out


def lastlayer_features(model: Any, encoded: list[Encoded], pad_id: int, batch_size: int = 64,
                       progress: bool = True) -> np.ndarray:
    """[N, H] float32 last-layer gradient proxy (not normalised)."""
    model.eval()
    ext = Extractor(partial(lastlayer_batch, model), _hidden_size(model))
    with tqdm(total=len(encoded), desc="features", unit="sample", disable=not progress) as bar:
        return extract(ext, encoded, pad_id, batch_size, bar=bar)


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
    from clusterft.artifacts import save_npy
    from clusterft.shards import shard_path

    total = sum(ranges[i][1] - ranges[i][0] for i in todo)
    with tqdm(total=total, desc=f"features[rank {rank}]", unit="sample", position=rank,
              dynamic_ncols=True) as bar:
        for i in todo:
            start, stop = ranges[i]
            feats = extract(ext, encoded[start:stop], pad_id, batch_size, device, bar, precision)
            save_npy(shard_path(folder, i, ranges[i]), feats)
    return total


def _sum_over_ranks(values: list[int], device: torch.device) -> list[int]:
    """Element-wise sum over the torchrun world (also a barrier); identity for a world of one."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return values
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t)
    return [int(v) for v in t.tolist()]


@dataclass
class FeatureModel:
    """What the features are computed through (see `features.model`)."""

    model: Any  # a model, or the snapshot models (loss_traj), oldest first
    tokenizer: Any
    render: Any  # clusterft.data.Renderer for the train split
    depends_on: list[Path]  # folders whose content the features depend on (shard spec)
    max_length: int


def _snapshots(cfg: Any) -> list[Path]:
    from clusterft.warmup import state_dir

    snaps = sorted((state_dir(cfg) / "snapshots").glob("step-*"))
    if not snaps:
        from clusterft.model import ModelError

        raise ModelError(f"{state_dir(cfg) / 'snapshots'}: no warmup snapshots; rerun warmup "
                         "with features.kind: loss_traj")
    return snaps


def load_feature_model(cfg: Any, device: torch.device) -> FeatureModel:
    """The model `features.model` names, loaded for `features.kind`, with its tokenizer."""
    from transformers import AutoModel, AutoTokenizer

    from clusterft.data import Renderer, renderer
    from clusterft.model import base_model_dir, load_model, load_tokenizer, load_with_adapter
    from clusterft.warmup import state_dir

    fm, kind, plain = cfg.features.model, cfg.features.kind, Renderer(cfg.data.prompt_template)
    if fm == "target":
        base, adapter = base_model_dir(cfg), state_dir(cfg) / "adapter"
        snaps = _snapshots(cfg) if kind == "loss_traj" else [adapter]
        models = [load_with_adapter(base, s, cfg.model).to(device) for s in snaps]
        return FeatureModel(models if kind == "loss_traj" else models[0], load_tokenizer(base, cfg.model),
                            renderer(cfg), [*snaps, base], cfg.data.max_length)
    if fm == "proxy":
        proxy = state_dir(cfg) / "proxy"
        snaps = _snapshots(cfg) if kind == "loss_traj" else [proxy]
        models = [load_model(s).to(device) for s in snaps]
        return FeatureModel(models if kind == "loss_traj" else models[0], load_tokenizer(proxy), plain,
                            [*snaps, proxy], cfg.data.max_length)
    tok = AutoTokenizer.from_pretrained(fm, trust_remote_code=False)
    model = AutoModel.from_pretrained(fm, dtype=torch.float32, use_safetensors=True,
                                      trust_remote_code=False).to(device)
    limit = int(getattr(model.config, "max_position_embeddings", 512) or 512)
    return FeatureModel(model, tok, plain, [Path(fm)], min(limit, 2 * cfg.data.max_length))


def encode_for(fmodel: FeatureModel, examples: list[Any]) -> list[Encoded]:
    """Tokens for the feature model: label-masked (causal LMs), or the whole text (encoders)."""
    from clusterft.data import encode_all

    tok = fmodel.tokenizer
    if tok.eos_token_id is not None:
        return encode_all(examples, tok, fmodel.max_length)
    return [Encoded(e.id, ids, list(ids)) for e in examples
            for ids in [tok(f"{e.prompt} {e.response}", truncation=True,
                            max_length=fmodel.max_length)["input_ids"]]]


def run_features(cfg: Any) -> dict:
    """Stage `features`: features/features.npy [N, D] float32, manifest.json, metrics.json.

    Under torchrun every rank computes its share of the missing shards; without it the
    process is a world of one. Returns the metrics (on every rank)."""
    import torch.distributed as dist

    from clusterft.distributed import cleanup, init_distributed

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
    from clusterft.artifacts import read_json
    from clusterft.data import load_examples
    from clusterft.distributed import barrier
    from clusterft.shards import missing_shards, prepare_shard_dir, shard_ranges
    from clusterft.warmup import state_dir

    fcfg = cfg.features
    fmodel = load_feature_model(cfg, info.device)
    examples = load_examples(cfg, "train", fmodel.render)
    encoded = encode_for(fmodel, examples)
    tokenizer = fmodel.tokenizer
    ext = build_extractor(fmodel.model, fcfg, state_dir(cfg) / "adapter", info.device)
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
    samples, shards = _sum_over_ranks([n_done, len(mine)], info.device)
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
    from clusterft.artifacts import file_digest, write_json
    from clusterft.model import base_model_dir
    from clusterft.shards import merge_shards, remove_shard_dir

    fcfg, out = cfg.features, cfg.artifact("features")
    merge_shards(out / "shards", ranges, dim, out / "features.npy")
    if fcfg.kind == "loss_traj":  # the sphere lift needs every row's norm: done after the merge
        from clusterft.artifacts import load_npy, save_npy

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
