"""Per-sample feature extractors, one per kind: a collated batch in, [B, dim] float32 out.

Kinds (`features.kind`):
- lora_grad: gradient of the sample's mean response-token loss w.r.t. the LoRA
  weights, exact and batched (core.lora_grads); optionally Adam-preconditioned with
  the warmup moments (LESS); then projected to `features.dim` by a seeded random matrix
  (core.projection). [N, dim], or [N, P] with projection `none`.
- lastlayer: the paper's proxy: for each response token, (p_y - 1) * h_last (final hidden
  state scaled by the loss gradient w.r.t. the true token's logit), averaged over the
  response tokens; one forward pass, no backward. [N, hidden_size].
- embedding (default): the final hidden state mean-pooled over all non-pad tokens, prompt
  included (the usual sentence-embedding pooling: what the sample says, not how the model
  would learn from it). [N, hidden_size].
- loss_traj (S2L): the sample's mean response-token loss at each warmup snapshot, lifted
  onto a sphere (one extra column) so that the row normalisation clustering applies keeps
  the loss level, not only the curve's shape. [N, snapshots + 1].

Rows are NOT L2-normalised: clustering and selection normalise rows themselves, and the
raw norm (e.g. how large a sample's gradient is) stays available.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import numpy as np
import torch

from clusterft.core.lora_grads import AdamMoments, PerSampleLoraGrads
from clusterft.core.losses import per_sample_loss
from clusterft.core.projection import RandomProjection
from clusterft.core.tokens import IGNORE_INDEX

log = logging.getLogger(__name__)
MomentsLoader = Callable[[list[str]], AdamMoments]  # LoRA parameter names -> the warmup's moments

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


def hidden_size(model: Any) -> int:
    return int(model.get_input_embeddings().embedding_dim)


def _lastlayer(model: Any, fcfg: Any, load_moments: MomentsLoader | None, device: torch.device) -> Extractor:
    return Extractor(partial(lastlayer_batch, model), hidden_size(model))


def _embedding(model: Any, fcfg: Any, load_moments: MomentsLoader | None, device: torch.device) -> Extractor:
    if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
        return Extractor(partial(encoder_batch, model), hidden_size(model))  # an encoder
    return Extractor(partial(embedding_batch, model), hidden_size(model))


def _loss_traj(model: Any, fcfg: Any, load_moments: MomentsLoader | None, device: torch.device) -> Extractor:
    """`model` here is the list of snapshot models, oldest first."""
    return Extractor(partial(loss_traj_batch, model), len(model), {"snapshots": len(model)})


@dataclass
class LoraGradPipeline:
    """batch -> per-sample LoRA gradients [B, P] -> Adam preconditioning (optional) ->
    random projection [B, dim] (optional). `grads` is swappable (the benchmark's loop)."""

    grads: Callable[[Batch], torch.Tensor]
    moments: AdamMoments | None = None
    proj: RandomProjection | None = None

    def transform(self, g: torch.Tensor) -> torch.Tensor:
        """[B, P] raw gradients -> [B, dim] features."""
        g = self.moments.precondition(g) if self.moments is not None else g
        return self.proj(g) if self.proj is not None else g

    def __call__(self, batch: Batch) -> torch.Tensor:
        return self.transform(self.grads(batch))


def _lora_grad(model: Any, fcfg: Any, load_moments: MomentsLoader | None, device: torch.device) -> Extractor:
    grads = PerSampleLoraGrads(model)
    if fcfg.precondition and load_moments is None:
        raise ValueError("features.precondition needs the warmup's Adam moments (load_moments)")
    moments = load_moments(grads.names).to(device) if fcfg.precondition else None
    proj = (None if fcfg.projection == "none" else
            RandomProjection(grads.n_params, fcfg.dim, fcfg.projection, fcfg.seed,
                             fcfg.projection_cache_mb, device))
    if proj is not None and fcfg.dim >= grads.n_params:
        log.info("features.dim=%d >= %d LoRA weights: projection none would keep the exact "
                 "gradient in fewer columns", fcfg.dim, grads.n_params)
    info = {"n_lora_params": grads.n_params, "n_lora_modules": len(grads.sites),
            "projection_cached": bool(proj is not None and proj.cached)}
    return Extractor(LoraGradPipeline(grads, moments, proj), proj.dim if proj else grads.n_params, info)


FEATURE_BUILDERS: dict[str, Callable[[Any, Any, MomentsLoader | None, torch.device], Extractor]] = {
    "lora_grad": _lora_grad, "lastlayer": _lastlayer, "embedding": _embedding, "loss_traj": _loss_traj,
}


def build_extractor(model: Any, fcfg: Any, load_moments: MomentsLoader | None = None,
                    device: torch.device | str = "cpu") -> Extractor:
    """The extractor of kind `fcfg.kind` (see FEATURE_BUILDERS) on `model` (put in eval mode);
    `load_moments` reads the warmup's Adam moments (lora_grad with precondition)."""
    if fcfg.kind not in FEATURE_BUILDERS:
        raise ValueError(f"unknown features.kind {fcfg.kind!r}; known: {sorted(FEATURE_BUILDERS)}")
    for m in model if isinstance(model, list) else [model]:
        m.eval()  # no dropout: deterministic features
    return FEATURE_BUILDERS[fcfg.kind](model, fcfg, load_moments, torch.device(device))
