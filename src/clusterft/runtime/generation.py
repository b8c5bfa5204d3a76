"""A model's answers (batched greedy generation) and its held-out loss per skill."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from clusterft.core.losses import ResponseLoss
from clusterft.core.scoring import hit_pairs, summarise_hits
from clusterft.core.tokens import Example, collate, encode_all
from clusterft.runtime import parallel
from clusterft.runtime.distributed import gather_objects
from clusterft.runtime.precision import autocast


@torch.no_grad()
def generate_answers(model: Any, tokenizer: Any, prompts: list[str], batch_size: int,
                     max_new_tokens: int, progress: bool = True) -> list[str]:
    """Greedy decoding with left padding; returns the decoded continuations (progress on stderr)."""
    model.eval()
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    answers: list[str] = []
    try:
        for i in tqdm(range(0, len(prompts), batch_size), desc="evaluate (generate)", unit="batch",
                      disable=not progress):
            enc = tokenizer(prompts[i : i + batch_size], return_tensors="pt", padding=True)
            enc = {k: v.to(model.device) for k, v in enc.items()}
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
            new = out[:, enc["input_ids"].shape[1]:]
            answers += tokenizer.batch_decode(new, skip_special_tokens=True)
    finally:
        tokenizer.padding_side = old_side
    return answers


@torch.no_grad()
def sample_losses(model: Any, tokenizer: Any, examples: list[Example], max_length: int,
                  batch_size: int, loss: ResponseLoss | None = None) -> list[float]:
    """Each sample's mean response-token loss, in `examples` order. Batches group samples of
    similar length (less padding) and the output layer runs at answer positions only: on a
    49k vocabulary the full logits of prompt and pad tokens were most of the cost."""
    model.eval()
    loss = loss or ResponseLoss(model)
    enc = encode_all(examples, tokenizer, max_length)
    order = sorted(range(len(enc)), key=lambda i: enc[i].n_tokens)
    losses = [0.0] * len(enc)
    for i in range(0, len(order), batch_size):
        rows = order[i : i + batch_size]
        b = {k: v.to(model.device) for k, v in collate([enc[r] for r in rows], tokenizer.pad_token_id).items()}
        for r, v in zip(rows, loss(model, b).tolist()):
            losses[r] = v
    return losses


def heldout_loss(model: Any, tokenizer: Any, examples: list[Example], max_length: int,
                 batch_size: int) -> dict[str, float]:
    """Mean response-token loss over samples, overall and per skill/source."""
    losses = sample_losses(model, tokenizer, examples, max_length, batch_size)
    by: dict[str, list[float]] = defaultdict(list)
    for ex, l in zip(examples, losses):
        by[ex.skill or "all"].append(l)
    open_ended = [l for ex, l in zip(examples, losses) if not ex.scored]
    return {"heldout_loss": float(np.mean(losses)),
            "heldout_loss_open_ended": float(np.mean(open_ended)) if open_ended else float("nan"),
            "heldout_loss_by_skill": {k: float(np.mean(v)) for k, v in sorted(by.items())}}


def validation_point(model: Any, tokenizer: Any, examples: list[Example], cfg: Any, info: Any,
                     loss: ResponseLoss | None = None) -> dict[str, float]:
    """Validation macro / worst-skill / per-skill exact match and held-out loss of a model as it trains
    (a point of its curve, evaluate.every): each rank scores the rows rank::world and the
    results are gathered, so the point costs 1/world of a whole evaluation. Every rank
    returns the same figures; the model is back in training mode afterwards."""
    inner, e = parallel.unwrap(model), cfg.evaluate
    share = examples[info.rank::info.world_size]
    scored = [x for x in share if x.scored]
    with autocast(cfg.train.precision, info.device):
        answers = generate_answers(inner, tokenizer, [x.prompt for x in scored], e.batch_size, e.max_new_tokens,
                                   progress=False)
        losses = sample_losses(inner, tokenizer, share, cfg.data.max_length, e.batch_size, loss)
    model.train()
    parts = gather_objects((hit_pairs(scored, answers), losses))
    em = summarise_hits([h for hits, _ in parts for h in hits])
    all_losses = [v for _, ls in parts for v in ls]
    return {"val_macro_em": em["macro_exact_match"], "val_worst_skill_em": em["worst_skill_exact_match"],
            "val_heldout_loss": float(np.mean(all_losses)), "val_skill_em": em["exact_match"]}
