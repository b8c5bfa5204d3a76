"""Instruction data files: strict JSONL loading and atomic writing.

Two record forms are accepted: Alpaca (`instruction`, optional `input`, `output`) and chat
(`messages`: list of `{role, content}`, the last one from the assistant). Every record gets
a stable id: its own `id` field, else a hash of its content. A record with
`"exact_match": false` counts for the held-out loss only (open-ended answers), not for exact
match. Errors name the file, the line and the field.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

from clusterft.core.tokens import Example, Renderer
from clusterft.errors import DataError
from clusterft.io.artifacts import atomic_write_text
from clusterft.spec.config import surrogate_problem, too_deep

CHAT_ROLES = ("system", "user", "assistant")


def _require_str(rec: dict, key: str, where: str, allow_empty: bool = False) -> str:
    if key not in rec:
        raise DataError(f"{where}: missing field '{key}'")
    val = rec[key]
    if not isinstance(val, str):
        raise DataError(f"{where}: field '{key}' must be a string, got {type(val).__name__}")
    if not allow_empty and not val.strip():
        raise DataError(f"{where}: field '{key}' is empty")
    return val


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


def _parse(text: str, where: str) -> Any:
    """One JSONL line as a JSON value; DataError for bad JSON, nesting past Python's
    recursion limit and lone surrogates, naming the line (and the field)."""
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from exc
    except RecursionError:
        raise DataError(f"{where}: invalid JSON: {too_deep()}") from None
    problem = surrogate_problem(rec)
    if problem:
        raise DataError(f"{where}: {problem}")
    return rec


def load_jsonl(path: str | Path, render: str | Renderer) -> list[Example]:
    """Load and validate a JSONL file; raise DataError naming file, line and field.

    `render` is a Renderer or a plain prompt template. A UTF-8 byte-order mark is skipped."""
    p = Path(path)
    if p.is_dir():
        raise DataError(f"{p}: is a folder, not a data file (name the .jsonl file inside it)")
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
        rid, ex = _from_record(_parse(text, where), where, render)
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


def write_jsonl(path: str | Path, records: Iterable[dict]) -> None:
    """Write records atomically (temp file + rename)."""
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
