"""Losses on a batch of samples: each sample's mean loss over its answer tokens, and the
weighted sum the data-parallel update is built from."""

from __future__ import annotations

from typing import Any

import torch

from clusterft.core.tokens import IGNORE_INDEX


def per_sample_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over each sample's response tokens; shape [B]."""
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    tok = torch.nn.functional.cross_entropy(
        shift_logits.reshape(-1, shift_logits.size(-1)),
        shift_labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    ).view(shift_labels.shape)
    mask = (shift_labels != IGNORE_INDEX).float()
    return (tok * mask).sum(1) / mask.sum(1).clamp(min=1.0)


def weighted_loss(model: Any, batch: dict[str, torch.Tensor], weights: torch.Tensor,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale * sum_i w_i l_i, per-sample losses l [B])."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    losses = per_sample_loss(out.logits, batch["labels"])
    return scale * (weights * losses).sum(), losses.detach()
