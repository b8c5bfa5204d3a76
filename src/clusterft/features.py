"""Gradient features: one low-dimensional vector per training sample.

`lastlayer` is the paper's cheap proxy: for each response token, (p_y - 1) * h_last (the
final hidden state scaled by the loss gradient w.r.t. the true token's logit), averaged
over the response tokens; one forward pass, no backward. Shape [N, hidden_size].
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from clusterft.data import IGNORE_INDEX, Encoded, collate


@torch.no_grad()
def lastlayer_features(model: Any, encoded: list[Encoded], pad_id: int, batch_size: int = 64,
                       progress: bool = True) -> np.ndarray:
    """[N, H] float32 last-layer gradient proxy (not normalised)."""
    model.eval()
    out: list[np.ndarray] = []
    for i in tqdm(range(0, len(encoded), batch_size), desc="features", unit="batch",
                  disable=not progress):
        batch = collate(encoded[i : i + batch_size], pad_id)
        res = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    output_hidden_states=True)
        h = res.hidden_states[-1][:, :-1, :].float()  # state that predicts token t+1
        labels = batch["labels"][:, 1:]
        mask = labels != IGNORE_INDEX
        logp = torch.log_softmax(res.logits[:, :-1, :].float(), dim=-1)
        p_y = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1).exp()
        coef = (p_y - 1.0) * mask
        feat = (coef.unsqueeze(-1) * h).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        out.append(feat.cpu().numpy().astype(np.float32))
    return np.concatenate(out)


def run_features(cfg: Any) -> dict:
    """Stage `features`: features/features.npy [N, D] float32 + features/manifest.json."""
    import time

    from clusterft.artifacts import save_npy, write_json
    from clusterft.data import encode_all, load_examples
    from clusterft.model import base_model_dir, load_tokenizer, load_with_adapter

    start = time.perf_counter()
    base = base_model_dir(cfg)
    tokenizer = load_tokenizer(base, cfg.model)
    examples = load_examples(cfg, "train")
    encoded = encode_all(examples, tokenizer, cfg.data.max_length)
    model = load_with_adapter(base, cfg.artifact("warmup", "adapter"), cfg.model)
    feats = lastlayer_features(model, encoded, tokenizer.pad_token_id, cfg.features.batch_size)
    out = cfg.artifact("features")
    save_npy(out / "features.npy", feats)
    seconds = time.perf_counter() - start
    manifest = {
        "kind": cfg.features.kind,
        "n": int(feats.shape[0]),
        "dim": int(feats.shape[1]),
        "model": str(base),
        "ids": [e.id for e in examples],
        "wall_clock_s": seconds,
        "samples_per_s": feats.shape[0] / seconds,
    }
    write_json(out / "manifest.json", manifest)
    metrics = {k: v for k, v in manifest.items() if k != "ids"}
    write_json(out / "metrics.json", metrics)
    return metrics
