"""The data as the model being trained reads it: each split's examples, rendered through
the plain prompt template or the model tokenizer's own chat template (`data.chat_template`)."""

from __future__ import annotations

from typing import Any

from clusterft.core.tokens import Example, Renderer, chat_renderer
from clusterft.io.examples import load_jsonl
from clusterft.runtime.model import base_model_dir, load_tokenizer


def renderer(cfg: Any) -> Renderer:
    """The prompt renderer `cfg.data` asks for (the chat template needs the model's tokenizer)."""
    if not cfg.data.chat_template:
        return Renderer(cfg.data.prompt_template)
    return chat_renderer(load_tokenizer(base_model_dir(cfg), cfg.model), cfg.data.prompt_template,
                         cfg.data.system_prompt)


def load_examples(cfg: Any, split: str, render: Renderer | None = None) -> list[Example]:
    """Examples of one split ('train', 'validation', 'test') as named in `cfg.data`."""
    return load_jsonl(getattr(cfg.data, split), render or renderer(cfg))
