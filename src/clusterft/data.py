"""Instruction data: strict JSONL loading, prompt templating and label-masked tokenization.

Two record forms are accepted: Alpaca (`instruction`, optional `input`, `output`) and chat
(`messages`: list of `{role, content}`, the last one from the assistant). Every record gets
a stable id: its own `id` field, else a hash of its content. Prompts are rendered by a
`Renderer`: the plain `prompt_template`, or the tokenizer's own chat template
(`data.chat_template`). A record with `"exact_match": false` counts for the held-out loss
only (open-ended answers), not for exact match.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

IGNORE_INDEX = -100
CHAT_ROLES = ("system", "user", "assistant")


class DataError(ValueError):
    """Bad input data; the message names file, line and field."""


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


def _require_str(rec: dict, key: str, where: str, allow_empty: bool = False) -> str:
    if key not in rec:
        raise DataError(f"{where}: missing field '{key}'")
    val = rec[key]
    if not isinstance(val, str):
        raise DataError(f"{where}: field '{key}' must be a string, got {type(val).__name__}")
    if not allow_empty and not val.strip():
        raise DataError(f"{where}: field '{key}' is empty")
    return val


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


def _from_record(rec: Any, where: str, render: Renderer) -> tuple[str | None, Example]:
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    rid = rec.get("id")
    if rid is not None and not isinstance(rid, (str, int)):
        raise DataError(f"{where}: field 'id' must be a string or integer")
    skill = rec.get("skill")
    if skill is not None and not isinstance(skill, str):
        raise DataError(f"{where}: field 'skill' must be a string, got {type(skill).__name__}")
    scored = rec.get("exact_match", True)
    if not isinstance(scored, bool):
        raise DataError(f"{where}: field 'exact_match' must be true or false, got {scored!r}")
    if "messages" in rec:
        msgs = rec["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise DataError(f"{where}: field 'messages' must be a non-empty list")
        lines = []
        for j, m in enumerate(msgs):
            mw = f"{where}: messages[{j}]"
            if not isinstance(m, dict):
                raise DataError(f"{mw}: expected an object with 'role' and 'content'")
            role = _require_str(m, "role", mw)
            if role not in CHAT_ROLES:
                raise DataError(f"{mw}: field 'role' must be one of {CHAT_ROLES}, got {role!r}")
            content = _require_str(m, "content", mw)
            lines.append((role, content))
        if lines[-1][0] != "assistant":
            raise DataError(f"{where}: the last message must come from the assistant")
        example = Example(id="", prompt=render.turns(lines[:-1]), response=lines[-1][1], skill=skill)
    else:
        if "instruction" not in rec and "output" not in rec:
            raise DataError(
                f"{where}: record is neither Alpaca form (instruction/input/output) "
                "nor chat form (messages)"
            )
        instruction = _require_str(rec, "instruction", where)
        input_text = _require_str(rec, "input", where, allow_empty=True) if "input" in rec else ""
        output = _require_str(rec, "output", where)
        example = Example(id="", prompt=render.alpaca(instruction, input_text), response=output,
                          skill=skill)
    example.scored = scored
    return (str(rid) if rid is not None else None), example


def load_jsonl(path: str | Path, render: str | Renderer) -> list[Example]:
    """Load and validate a JSONL file; raise DataError naming file, line and field.

    `render` is a Renderer or a plain prompt template. A UTF-8 byte-order mark is skipped."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: data file not found")
    render = Renderer(render) if isinstance(render, str) else render
    raw = p.read_bytes()
    if raw.startswith(b"\xef\xbb\xbf"):  # BOM from spreadsheet / Windows exports
        raw = raw[3:]
    examples: list[Example] = []
    first_line: dict[str, int] = {}  # id -> line it first appeared on
    hashed: dict[str, int] = {}  # content hash -> copies seen (identical records)
    for lineno, line in enumerate(raw.split(b"\n"), start=1):
        where = f"{p}:{lineno}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{where}: not valid UTF-8 (byte {exc.start})") from exc
        if not text.strip():
            continue
        try:
            rec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from exc
        rid, ex = _from_record(rec, where, render)
        if rid is None:
            digest = hashlib.sha1(
                json.dumps([ex.prompt, ex.response], ensure_ascii=False).encode()
            ).hexdigest()[:12]
            copies = hashed.get(digest, 0)
            hashed[digest] = copies + 1
            rid = digest if copies == 0 else f"{digest}-{copies + 1}"
        elif rid in first_line:
            raise DataError(f"{where}: duplicate id {rid!r} (first seen on line {first_line[rid]})")
        first_line[rid] = lineno
        ex.id = rid
        ex.meta = {"line": lineno}
        examples.append(ex)
    if not examples:
        raise DataError(f"{p}: no records (the file is empty)")
    return examples


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
    import logging

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


def write_jsonl(path: str | Path, records: Iterable[dict]) -> None:
    """Write records atomically (temp file + rename)."""
    from clusterft.artifacts import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def renderer(cfg: Any) -> Renderer:
    """The prompt renderer `cfg.data` asks for (the chat template needs the model's tokenizer)."""
    if not cfg.data.chat_template:
        return Renderer(cfg.data.prompt_template)
    from clusterft.model import base_model_dir, load_tokenizer

    return chat_renderer(load_tokenizer(base_model_dir(cfg), cfg.model), cfg.data.prompt_template,
                         cfg.data.system_prompt)


def load_examples(cfg: Any, split: str, render: Renderer | None = None) -> list[Example]:
    """Examples of one split ('train', 'validation', 'test') as named in `cfg.data`."""
    return load_jsonl(getattr(cfg.data, split), render or renderer(cfg))
