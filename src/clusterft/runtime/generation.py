"""A model's answers (batched greedy generation) and its held-out loss per skill."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from clusterft.core.losses import per_sample_loss
from clusterft.core.tokens import Example, collate, encode_all


@torch.no_grad()
def generate_answers(model: Any, tokenizer: Any, prompts: list[str], batch_size: int,
                     max_new_tokens: int) -> list[str]:
    """Greedy decoding with left padding; returns the decoded continuations (progress on stderr)."""
    model.eval()
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    answers: list[str] = []
    try:
        for i in tqdm(range(0, len(prompts), batch_size), desc="evaluate (generate)", unit="batch"):
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
def heldout_loss(model: Any, tokenizer: Any, examples: list[Example], max_length: int,
                 batch_size: int) -> dict[str, float]:
    """Mean response-token loss over samples, overall and per skill/source."""
    model.eval()
    enc = encode_all(examples, tokenizer, max_length)
    losses: list[float] = []
    for i in range(0, len(enc), batch_size):
        b = {k: v.to(model.device) for k, v in collate(enc[i : i + batch_size], tokenizer.pad_token_id).items()}
        out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
        losses += per_sample_loss(out.logits, b["labels"]).tolist()
    by: dict[str, list[float]] = defaultdict(list)
    for ex, l in zip(examples, losses):
        by[ex.skill or "all"].append(l)
    open_ended = [l for ex, l in zip(examples, losses) if not ex.scored]
    return {"heldout_loss": float(np.mean(losses)),
            "heldout_loss_open_ended": float(np.mean(open_ended)) if open_ended else float("nan"),
            "heldout_loss_by_skill": {k: float(np.mean(v)) for k, v in sorted(by.items())}}
