"""Instruction samples as a model sees them: prompt rendering (a plain template or a
tokenizer's chat template), label-masked tokenization and padding into batches.

A record's prompt and answer are tokenized apart (a clean boundary); the prompt tokens are
masked out of the loss (IGNORE_INDEX), so training and the features see only the answer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from clusterft.errors import DataError

IGNORE_INDEX = -100


@dataclass
class Example:
    """One instruction sample, already split into prompt text and response text."""

    id: str
    prompt: str
    response: str
    skill: str | None = None
    scored: bool = True  # counted by exact match (False: held-out loss only)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Encoded:
    """Token ids of one example; `labels` is IGNORE_INDEX on prompt tokens."""

    id: str
    input_ids: list[int]
    labels: list[int]
    truncated: bool = False

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)


def render_prompt(template: str, instruction: str, input_text: str) -> str:
    """Fill the Alpaca-style template; the input block disappears when input is empty."""
    input_block = f"Input: {input_text}\n" if input_text.strip() else ""
    return template.format(instruction=instruction, input_block=input_block)


Turns = list[tuple[str, str]]  # (role, content) of the prompt, assistant answer excluded


@dataclass
class Renderer:
    """Turns a record's prompt into text: the plain template, or a tokenizer's chat template."""

    template: str
    chat: Callable[[Turns], str] | None = None  # set: every record goes through the chat template
    system_prompt: str = ""

    def alpaca(self, instruction: str, input_text: str) -> str:
        if self.chat is None:
            return render_prompt(self.template, instruction, input_text)
        user = f"{instruction}\n\n{input_text}" if input_text.strip() else instruction
        return self.turns([("user", user)])

    def turns(self, turns: Turns) -> str:
        if self.chat is None:
            return "".join(f"{r.capitalize()}: {c}\n" for r, c in turns) + "Assistant:"
        if self.system_prompt and turns[0][0] != "system":
            turns = [("system", self.system_prompt), *turns]
        return self.chat(turns)


def chat_renderer(tokenizer: Any, template: str, system_prompt: str = "") -> Renderer:
    """A Renderer through `tokenizer.apply_chat_template` (generation prompt appended)."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("data.chat_template: the tokenizer has no chat template")

    def chat(turns: Turns) -> str:
        msgs = [{"role": r, "content": c} for r, c in turns]
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)

    return Renderer(template, chat, system_prompt)


def encode(example: Example, tokenizer: Any, max_length: int) -> Encoded:
    """Tokenize prompt and response separately (clean boundary), mask the prompt, add EOS.

    Longer than `max_length`: the response keeps at least one token and the prompt is cut
    from the left, so the tokens nearest the answer survive.
    """
    prompt_ids = tokenizer(example.prompt, add_special_tokens=True)["input_ids"]
    sep = "" if example.prompt[-1:].isspace() else " "  # chat templates end in a newline
    resp_ids = tokenizer(sep + example.response, add_special_tokens=False)["input_ids"]
    resp_ids = list(resp_ids) + [tokenizer.eos_token_id]
    truncated = len(prompt_ids) + len(resp_ids) > max_length
    if truncated:
        resp_ids = resp_ids[: max(1, max_length - len(prompt_ids))]
        keep_prompt = max_length - len(resp_ids)
        prompt_ids = prompt_ids[len(prompt_ids) - keep_prompt :] if keep_prompt > 0 else []
    ids = list(prompt_ids) + resp_ids
    labels = [IGNORE_INDEX] * len(prompt_ids) + resp_ids
    return Encoded(id=example.id, input_ids=ids, labels=labels, truncated=truncated)


def encode_all(examples: Iterable[Example], tokenizer: Any, max_length: int) -> list[Encoded]:
    return [encode(e, tokenizer, max_length) for e in examples]


TRUNCATION_WARN = 0.05  # warn when more than this fraction of a split is cut at data.max_length


def truncation_report(encoded: list[Encoded], split: str = "", max_length: int | None = None) -> dict[str, Any]:
    """How many samples were longer than max_length and cut; a warning above TRUNCATION_WARN
    (cut samples train and score on partial text)."""
    n = sum(e.truncated for e in encoded)
    lengths = [e.n_tokens for e in encoded]
    report = {
        "n": len(encoded),
        "n_truncated": n,
        "truncated_fraction": n / max(1, len(encoded)),
        "mean_tokens": sum(lengths) / max(1, len(lengths)),
        "max_tokens": max(lengths, default=0),
    }
    if report["truncated_fraction"] > TRUNCATION_WARN:
        logging.getLogger(__name__).warning(
            "%s: %d of %d samples (%.0f%%) are longer than data.max_length=%s tokens and were truncated; "
            "raise data.max_length", split or "data", n, len(encoded), 100 * report["truncated_fraction"],
            max_length)
    return report


def _answer_start(e: Encoded) -> int:
    return next((i for i, t in enumerate(e.labels) if t != IGNORE_INDEX), e.n_tokens)


def shared_prefix(encoded: list[Encoded]) -> list[int]:
    """The leading tokens every untruncated row shares before its first answer token (a system
    prompt and a chat template's opening): the decoder's keys and values there are the same for
    every row, so they can be computed once (ResponseLoss.prefix). Empty for fewer than 2 rows."""
    rows = [e for e in encoded if not e.truncated]  # cut from the prompt side: their start is gone
    if len(rows) < 2:
        return []
    first = rows[0].input_ids
    n = min(e.n_tokens for e in rows) - 1  # every row keeps a token to run the decoder on
    for e in rows:  # stop before the first answer token's predictor, which must run
        n = min(n, _answer_start(e) - 1)
        n = next((i for i in range(n) if e.input_ids[i] != first[i]), n)
    return first[: max(n, 0)]


def starts_with(e: Encoded, prefix: list[int]) -> bool:
    """Whether `prefix` can be cut from `e` and taken from a cache: its first tokens, ending
    before the position that predicts its first answer token."""
    return e.input_ids[: len(prefix)] == prefix and len(prefix) < _answer_start(e)


def collate(batch: list[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch: input_ids, attention_mask, labels (IGNORE_INDEX on pads)."""
    width = max(e.n_tokens for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, e in enumerate(batch):
        n = e.n_tokens
        ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
