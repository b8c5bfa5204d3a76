"""The model the features are computed through (`features.model`), and the batched forwards
that turn samples into feature rows.

`target`: the base model + the warmup's LoRA adapter, prompts rendered as they are trained;
`proxy`: the tiny model the warmup trained from scratch (plain prompt template, its own
tokenizer); or a sentence-encoder folder (mean-pooled embedding).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterft.core.features import Extractor
from clusterft.core.tokens import Encoded, Renderer, collate, encode_all
from clusterft.errors import ModelError
from clusterft.io.moments import state_dir
from clusterft.runtime.data import renderer
from clusterft.runtime.model import base_model_dir, hub_offline, load_model, load_tokenizer, load_with_adapter
from clusterft.runtime.precision import autocast


def extract(ext: Extractor, encoded: list[Encoded], pad_id: int, batch_size: int,
            device: torch.device | str = "cpu", bar: Any = None, precision: str = "fp32") -> np.ndarray:
    """[n, dim] float32 rows in input order; batches group similar lengths (less padding).
    `precision` (train.precision) autocasts the forwards as training does."""
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


@dataclass
class FeatureModel:
    """What the features are computed through (see `features.model`)."""

    model: Any  # a model, or the snapshot models (loss_traj), oldest first
    tokenizer: Any
    render: Renderer  # how the train split's prompts are rendered for it
    depends_on: list[Path]  # folders whose content the features depend on (shard spec)
    max_length: int


def _snapshots(cfg: Any) -> list[Path]:
    snaps = sorted((state_dir(cfg) / "snapshots").glob("step-*"))
    if not snaps:
        raise ModelError(f"{state_dir(cfg) / 'snapshots'}: no warmup snapshots; rerun warmup "
                         "with features.kind: loss_traj")
    return snaps


def load_feature_model(cfg: Any, device: torch.device) -> FeatureModel:
    """The model `features.model` names, loaded for `features.kind`, with its tokenizer."""
    from transformers import AutoModel, AutoTokenizer

    hub_offline()
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
    tok = AutoTokenizer.from_pretrained(fm, trust_remote_code=False, local_files_only=True)
    model = AutoModel.from_pretrained(fm, dtype=torch.float32, use_safetensors=True, trust_remote_code=False,
                                      local_files_only=True).to(device)
    limit = int(getattr(model.config, "max_position_embeddings", 512) or 512)
    return FeatureModel(model, tok, plain, [Path(fm)], min(limit, 2 * cfg.data.max_length))


def encode_for(fmodel: FeatureModel, examples: list[Any]) -> list[Encoded]:
    """Tokens for the feature model: label-masked (causal LMs), or the whole text (encoders)."""
    tok = fmodel.tokenizer
    if tok.eos_token_id is not None:
        return encode_all(examples, tok, fmodel.max_length)
    return [Encoded(e.id, ids, list(ids)) for e in examples
            for ids in [tok(f"{e.prompt} {e.response}", truncation=True,
                            max_length=fmodel.max_length)["input_ids"]]]
