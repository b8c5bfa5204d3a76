"""Small JSONL files for the data tests (the tiny `tokenizer` fixture is in conftest)."""

from __future__ import annotations

import json

from clusterft.spec.config import DataConfig

T = DataConfig().prompt_template


def write(tmp_path, lines, name="d.jsonl", raw=None):
    p = tmp_path / name
    if raw is not None:
        p.write_bytes(raw)
    else:
        p.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return p
