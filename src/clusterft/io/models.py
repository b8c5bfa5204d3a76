"""What a model folder must hold before any stage loads it (read without loading weights)."""

from __future__ import annotations

from pathlib import Path


def check_model_files(path: Path, gguf_file: str = "") -> str:
    """What makes `path` unusable as a model folder ('' when it is usable); reads no weights."""
    if gguf_file:
        return "" if (path / gguf_file).exists() else f"{path / gguf_file}: GGUF file not found (model.gguf_file)"
    if not (path / "config.json").exists():
        return f"{path}: no config.json; not a Hugging Face model folder"
    if not any(path.glob("*.safetensors")):
        hint = " (only pickle-based *.bin found; convert to safetensors)" if any(path.glob("*.bin")) else ""
        return f"{path}: no *.safetensors weights{hint}"
    return ""
