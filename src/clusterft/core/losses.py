"""Losses on a batch of samples: each sample's mean loss over its answer tokens (from full
logits, or with the output layer applied at answer positions only), whether the model's top
token is the answer's at every one of them, and the weighted sum the data-parallel update is
built from."""

from __future__ import annotations

import logging
from typing import Any

import torch

from clusterft.core.tokens import IGNORE_INDEX

log = logging.getLogger(__name__)


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


def top_token_rows(logits: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor, n: int) -> torch.Tensor:
    """[n] bool: at every scored position of row r (logits [T, V] and labels [T] of the scored
    positions, `rows` [T] their rows) the highest logit is the label; False for a row with none."""
    wrong = torch.zeros(n, dtype=torch.long, device=labels.device).index_add(
        0, rows, (logits.argmax(-1) != labels).long())
    seen = torch.zeros(n, dtype=torch.long, device=labels.device).index_add(0, rows, torch.ones_like(rows))
    return (wrong == 0) & (seen > 0)


def _decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Linear] | None:
    """(decoder stack, plain Linear output layer) of an HF causal LM (peft-wrapped or not),
    or None when the model does not expose them that way."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    get_decoder = getattr(base, "get_decoder", None)
    get_head = getattr(base, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    decoder, head = get_decoder(), get_head()
    if decoder is None or decoder is base or type(head) is not torch.nn.Linear:
        return None  # no separate decoder, or a LoRA-wrapped / custom head: use full logits
    return decoder, head


class ResponseLoss:
    """(model, batch) -> [B] mean response-token loss per sample, with the output layer
    applied only where a token has a label, and no padding mask for right-padded batches
    (pads come after every real token, so plain causal attention is exact and SDPA can take
    its causal fast path; pads carry no loss, so nothing flows back from them). On its first
    batch it checks itself against the model's own full-logit forward (per_sample_loss) and
    falls back to that when they differ (e.g. a model that scales or soft-caps its logits)."""

    def __init__(self, model: torch.nn.Module, response_only: bool = True) -> None:
        self.parts = _decoder_and_head(model) if response_only else None
        self.checked = self.parts is None

    def full(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], top: bool = False) -> Any:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        losses = per_sample_loss(logits, batch["labels"])
        if not top:
            return losses
        labels = batch["labels"][:, 1:]
        rows, cols = (labels != IGNORE_INDEX).nonzero(as_tuple=True)
        return losses, top_token_rows(logits[:, :-1][rows, cols], labels[rows, cols], rows, labels.shape[0])

    def fast(self, batch: dict[str, torch.Tensor], top: bool = False) -> Any:
        decoder, head = self.parts
        attn = batch["attention_mask"]
        if bool((attn[:, :-1] >= attn[:, 1:]).all()):
            attn = None  # right padding: causal attention already keeps real tokens off the pads
        hidden = decoder(input_ids=batch["input_ids"], attention_mask=attn)[0]
        labels = batch["labels"][:, 1:]  # hidden state t predicts token t + 1
        scored = labels != IGNORE_INDEX
        rows, cols = scored.nonzero(as_tuple=True)
        logits = head(hidden[rows, cols]).float()
        tok = torch.nn.functional.cross_entropy(logits, labels[rows, cols], reduction="none")
        counts = scored.sum(1).clamp(min=1)
        losses = torch.zeros(labels.shape[0], dtype=tok.dtype, device=tok.device).index_add(
            0, rows, tok / counts[rows])
        return (losses, top_token_rows(logits, labels[rows, cols], rows, labels.shape[0])) if top else losses

    def check(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> None:
        """Once: compare the fast path with the full logits on `batch`; keep it if equal."""
        if self.checked:
            return
        self.checked = True
        with torch.no_grad():
            want, got = self.full(model, batch), self.fast(batch)
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
            log.warning("response-only output layer disagrees with the model's logits "
                        "(max diff %.2e): using full logits", (got - want).abs().max().item())
            self.parts = None

    @property
    def response_only(self) -> bool:
        return self.parts is not None

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.check(model, batch)
        return self.fast(batch) if self.parts is not None else self.full(model, batch)

    def with_top(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(the losses __call__ gives, [B] bool: the model's top token is the label at every
        answer position, EOS included, so greedy decoding from the prompt writes that answer)."""
        self.check(model, batch)
        return self.fast(batch, top=True) if self.parts is not None else self.full(model, batch, top=True)
