"""Losses on a batch of samples: each sample's mean loss over its answer tokens (from full
logits, or with the output layer applied at answer positions only), the model's top token at
each of them, and the weighted sum the data-parallel update is built from."""

from __future__ import annotations

import copy
import logging
from typing import Any, Callable

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
    """(scale * sum_i w_i l_i, per-sample losses l [B]) from full logits over whole rows."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    losses = per_sample_loss(out.logits, batch["labels"])
    return scale * (weights * losses).sum(), losses.detach()


CHECK_ROWS = 4  # rows a fast path is checked on against full logits
CHECK_ERRORS = (TypeError, ValueError, AttributeError, RuntimeError, IndexError)  # a path a model cannot take


def _checked(what: str, compare: Callable[[], tuple[torch.Tensor, torch.Tensor, bool]], against: str,
             otherwise: str) -> bool:
    """Whether fast path `what` may be used: `compare` gives (its per-sample losses, those of
    `against`, whether all else it compares is equal), run without gradients; they must agree up
    to fp32 rounding. False, with a warning ending in `otherwise`, when they differ or the path
    raises (out of memory is raised: it says nothing about the path)."""
    try:
        with torch.no_grad():
            got, want, same = compare()
    except torch.OutOfMemoryError:
        raise
    except CHECK_ERRORS as err:
        log.warning("%s unusable (%s): %s", what, err, otherwise)
        return False
    if same and torch.allclose(got, want, rtol=1e-4, atol=1e-5):
        return True
    log.warning("%s disagrees with %s (max diff %.2e): %s", what, against, (got - want).abs().max().item(), otherwise)
    return False


def _no_autocast(batch: dict[str, torch.Tensor]) -> Any:
    """A check runs in the weights' own precision: autocast's rounding is not a disagreement."""
    return torch.autocast(batch["input_ids"].device.type, enabled=False)


def _scored_losses(logits: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """[B] mean loss per row from the logits of its scored positions ([T, V] at (rows, cols));
    a row with none scores 0."""
    tok = torch.nn.functional.cross_entropy(logits.float(), labels[rows, cols], reduction="none")
    counts = torch.bincount(rows, minlength=labels.shape[0]).clamp(min=1)
    return torch.zeros(labels.shape[0], dtype=tok.dtype, device=tok.device).index_add(0, rows, tok / counts[rows])


class TrainLoss:
    """weighted_loss at fewer FLOPs, same loss and gradients: the output layer runs at answer
    positions only (the model's own `logits_to_keep`), and `prefix`, the tokens every row starts
    with (tokens.shared_prefix: system prompt, chat template), runs once per micro-batch with
    gradients, its keys and values repeated to every row. `model` is what the loop calls (DDP's
    forward, so gradients sync); `module` the plain model the checks run on. Each path is checked
    once against full logits (fp32, eval mode, no gradients, a few rows: the output layer on the
    first batch, the shared prefix on the first batch that has it) and dropped when they differ or
    the model takes neither argument. `share_prefix=False` where a layer runs twice per forward
    (activation checkpointing) or is sharded (FSDP)."""

    def __init__(self, model: Any, module: torch.nn.Module, prefix: list[int], enabled: bool = True,
                 share_prefix: bool = True) -> None:
        self.model, self.module = model, module
        self.decoder = _decoder(module) if enabled else None
        self.prefix = torch.tensor(prefix if share_prefix and self.decoder is not None else [], dtype=torch.long)
        self.ok: bool | None = None if enabled else False  # answer-only output layer; None: not checked yet
        self.prefix_ok: bool | None = None if len(self.prefix) else False  # the shared prefix, likewise

    def _cut(self, batch: dict[str, torch.Tensor]) -> int:
        """How many leading tokens of the batch come from the shared prefix's cache (0: none)."""
        n = len(self.prefix)
        if not n or batch["input_ids"].shape[1] <= n:
            return 0
        ids = batch["input_ids"]
        if self.prefix.device != ids.device:
            self.prefix = self.prefix.to(ids.device)
        same = bool((ids[:, :n] == self.prefix).all() & (batch["labels"][:, : n + 1] == IGNORE_INDEX).all())
        return n if same else 0

    def fast(self, batch: dict[str, torch.Tensor], model: Any = None, share: bool | None = None) -> torch.Tensor:
        """[B] per-sample losses: output layer at scored positions only, the prefix once when
        `share` (default: when its check passed) and the batch has it."""
        n = self._cut(batch) if (self.prefix_ok if share is None else share) else 0
        kw: dict[str, Any] = {}
        if n:
            head = batch["input_ids"][:1, :n]
            kw["cache"] = self.decoder(input_ids=head, use_cache=True).cache
            kw["cache"].batch_repeat_interleave(batch["input_ids"].shape[0])
            batch = {k: v[:, n:] for k, v in batch.items()}
        else:
            kw["attention_mask"] = batch["attention_mask"]
        labels = batch["labels"][:, 1:]  # hidden state t predicts token t + 1
        scored = labels != IGNORE_INDEX
        keep = torch.zeros_like(batch["labels"], dtype=torch.bool)
        keep[:, :-1] = scored
        logits = (self.model if model is None else model)(input_ids=batch["input_ids"], logits_to_keep=keep, **kw).logits
        return _scored_losses(logits, labels, *scored.nonzero(as_tuple=True))

    def check(self, batch: dict[str, torch.Tensor]) -> None:
        """Outside autocast: each path not checked yet that `batch` takes, against full logits."""
        if self.ok is None:
            self.ok = self._agrees(batch, share=False)
        if self.ok and self.prefix_ok is None and self._cut(batch):
            self.prefix_ok = self._agrees(batch, share=True)

    def _agrees(self, batch: dict[str, torch.Tensor], share: bool) -> bool:
        """fast == full logits on the batch's first rows, run on the plain module (no DDP
        collectives: ranks may decide apart) in eval mode (dropout makes any two forwards differ)."""
        rows = {k: v[:CHECK_ROWS] for k, v in batch.items()}

        def compare() -> tuple[torch.Tensor, torch.Tensor, bool]:
            full = self.module(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"]).logits
            return self.fast(rows, self.module, share=share), per_sample_loss(full, rows["labels"]), True

        was = self.module.training
        self.module.eval()
        try:
            return _checked("shared prefix" if share else "answer-only output layer", compare, "full logits",
                            "not used in training")
        finally:
            self.module.train(was)

    def path(self) -> str:
        """Which way the loss is computed now (a step record's `loss_path`)."""
        return "full logits" if not self.ok else "answer positions, shared prefix" if self.prefix_ok \
            else "answer positions"

    def __call__(self, batch: dict[str, torch.Tensor], weights: torch.Tensor,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale * sum_i w_i l_i, per-sample losses l [B]), as weighted_loss."""
        if not self.ok:
            return weighted_loss(self.model, batch, weights, scale)
        losses = self.fast(batch)
        return scale * (weights * losses).sum(), losses.detach()


def top_tokens(logits: torch.Tensor, rows: torch.Tensor, n: int) -> torch.Tensor:
    """[n, A] the highest-logit token at each scored position of each row (logits [T, V] of the
    scored positions in row-major order, `rows` [T] their rows), IGNORE_INDEX past a row's last."""
    seen = torch.zeros(n, dtype=torch.long, device=rows.device).index_add(0, rows, torch.ones_like(rows))
    start = torch.cumsum(seen, 0) - seen
    out = torch.full((n, int(seen.max()) if n else 0), IGNORE_INDEX, dtype=torch.long, device=rows.device)
    out[rows, torch.arange(rows.numel(), device=rows.device) - start[rows]] = logits.argmax(-1)
    return out


def _base(model: torch.nn.Module) -> torch.nn.Module:
    """The HF model inside a peft wrapper (the model itself when unwrapped)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _decoder(model: torch.nn.Module) -> torch.nn.Module | None:
    """The decoder stack of an HF causal LM (peft-wrapped or not), None when it has none apart."""
    base = _base(model)
    get_decoder = getattr(base, "get_decoder", None)
    decoder = get_decoder() if get_decoder is not None else None
    return None if decoder is base else decoder


def _decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Linear] | None:
    """(decoder stack, plain Linear output layer) of an HF causal LM, or None when the model
    does not expose them that way (a LoRA-wrapped or custom head: use full logits)."""
    decoder = _decoder(model)
    get_head = getattr(_base(model), "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    return (decoder, head) if decoder is not None and type(head) is torch.nn.Linear else None


class ResponseLoss:
    """(model, batch) -> [B] mean response-token loss per sample, with the output layer
    applied only where a token has a label, and no padding mask for right-padded batches
    (pads come after every real token, so plain causal attention is exact and SDPA can take
    its causal fast path; pads carry no loss, so nothing flows back from them). On its first
    batch it checks itself against the model's own full-logit forward (per_sample_loss) and
    falls back to that when they differ (e.g. a model that scales or soft-caps its logits).
    Without gradients, a prefix every row shares (prefix, with_top's `past`) is run once, not
    once per row; checked once against the rows run whole, as above."""

    def __init__(self, model: torch.nn.Module, response_only: bool = True, cache_prefix: bool = True) -> None:
        self.parts = _decoder_and_head(model) if response_only else None
        self.checked = self.parts is None
        self.prefix_ok: bool | None = None if cache_prefix else False  # None: not checked yet

    def full(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], top: bool = False) -> Any:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        losses = per_sample_loss(logits, batch["labels"])
        if not top:
            return losses
        rows, cols = (batch["labels"][:, 1:] != IGNORE_INDEX).nonzero(as_tuple=True)
        return losses, top_tokens(logits[:, :-1][rows, cols], rows, logits.shape[0])

    def fast(self, batch: dict[str, torch.Tensor], top: bool = False, past: Any = None) -> Any:
        """As full, from the decoder's hidden states at answer positions only; `past` (prefix)
        holds the keys and values of tokens the batch's rows start with and are cut from it."""
        decoder, head = self.parts
        attn = batch["attention_mask"]
        if bool((attn[:, :-1] >= attn[:, 1:]).all()):
            attn = None  # right padding: causal attention already keeps real tokens off the pads
        kw: dict[str, Any] = {}
        if past is not None:
            kw["cache"] = past = copy.deepcopy(past)  # the decoder appends to it
            past.batch_repeat_interleave(batch["input_ids"].shape[0])
            if attn is not None:
                attn = torch.cat([attn.new_ones(attn.shape[0], past.get_seq_length()), attn], 1)
        hidden = decoder(input_ids=batch["input_ids"], attention_mask=attn, **kw)[0]
        labels = batch["labels"][:, 1:]  # hidden state t predicts token t + 1
        scored = labels != IGNORE_INDEX
        rows, cols = scored.nonzero(as_tuple=True)
        logits = head(hidden[rows, cols]).float()
        losses = _scored_losses(logits, labels, rows, cols)
        return (losses, top_tokens(logits, rows, labels.shape[0])) if top else losses

    def check(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> None:
        """Once: compare the fast path with the full logits on `batch`; keep it if equal."""
        if self.checked:
            return
        self.checked = True
        few = {k: v[:CHECK_ROWS] for k, v in batch.items()}

        def compare() -> tuple[torch.Tensor, torch.Tensor, bool]:
            with _no_autocast(batch):
                return self.fast(few), self.full(model, few), True

        if not _checked("response-only output layer", compare, "the model's logits", "using full logits"):
            self.parts = None

    def prefix(self, ids: list[int]) -> Any:
        """The decoder's key/value cache over `ids`, tokens every row of the coming batches starts
        with (tokens.shared_prefix), for with_top's `past`; None off the fast path."""
        if self.parts is None or not ids or self.prefix_ok is False:
            return None
        decoder = self.parts[0]
        device = next(decoder.parameters()).device
        with torch.no_grad():
            return decoder(input_ids=torch.tensor([ids], device=device), use_cache=True).cache

    def _prefix_agrees(self, batch: dict[str, torch.Tensor], cut: dict[str, torch.Tensor], past: Any) -> bool:
        """Once: the cached-prefix path against the rows run whole, on a few rows."""

        def compare() -> tuple[torch.Tensor, torch.Tensor, bool]:  # under the caller's autocast, as `past`
            (want, want_top), (got, got_top) = self.fast({k: v[:CHECK_ROWS] for k, v in batch.items()}, True), \
                self.fast({k: v[:CHECK_ROWS] for k, v in cut.items()}, True, past)
            return got, want, torch.equal(got_top, want_top)

        return _checked("shared-prompt cache", compare, "the rows run whole", "running every row whole")

    @property
    def response_only(self) -> bool:
        return self.parts is not None

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.check(model, batch)
        return self.fast(batch) if self.parts is not None else self.full(model, batch)

    def with_top(self, model: torch.nn.Module, batch: dict[str, torch.Tensor],
                 past: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(the losses __call__ gives, [B, A] the model's top token at each answer position, EOS
        included: where they are the answer's, greedy decoding from the prompt writes that answer).
        `past` (prefix) covers the first tokens of every row, which are then not run again."""
        self.check(model, batch)
        if self.parts is None:
            return self.full(model, batch, top=True)
        if past is not None and self.prefix_ok is not False:
            cut = {k: v[:, past.get_seq_length():] for k, v in batch.items()}
            if self.prefix_ok is None:
                self.prefix_ok = self._prefix_agrees(batch, cut, past)
            if self.prefix_ok:
                return self.fast(cut, top=True, past=past)
        return self.fast(batch, top=True)
