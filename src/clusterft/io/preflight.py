"""A loaded config checked against the filesystem before any stage spends time: your own
data files and model folder exist and are usable, an encoder folder is one, a chat
template is there to render with. (The built-in data and model are made by their stages.)
"""

from __future__ import annotations

import json
from pathlib import Path

from clusterft.errors import ConfigError
from clusterft.io.models import check_model_files
from clusterft.spec.config import FEATURE_MODELS, PipelineConfig, load_config
from clusterft.spec.stages import builtin_data_path, builtin_model_path


def load_checked(path: str | Path | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """load_config, then preflight: what every entry point runs before a stage."""
    cfg = load_config(path, overrides)
    preflight(cfg, "defaults" if path is None else str(path))
    return cfg


def preflight(cfg: PipelineConfig, label: str = "params") -> None:
    """Raise ConfigError (`label: key: message`) for the first input the filesystem refuses."""
    def bad(key: str, msg: str) -> None:
        raise ConfigError(f"{label}: {key}: {msg}")

    for s in ("train", "validation", "test"):
        if not cfg.builtin_split(s):
            path = Path(getattr(cfg.data, s))
            if not path.is_file():
                bad(f"data.{s}", f"{path}: file not found" + _default_hint(cfg, path, builtin_data_path(cfg, s)))
    if not cfg.builtin_model:
        folder = Path(cfg.model.path)
        if not folder.is_dir():
            bad("model.path", f"{folder}: model folder not found" + _default_hint(cfg, folder, builtin_model_path(cfg)))
        problem = check_model_files(folder, cfg.model.gguf_file)
        if problem:
            bad("model.path", problem)
    if cfg.features.model not in FEATURE_MODELS:
        _check_encoder(Path(cfg.features.model), bad)
    if cfg.data.chat_template and not cfg.model.gguf_file:  # GGUF templates are read at load
        _check_chat_template(Path(cfg.model.path), bad)


def _default_hint(cfg: PipelineConfig, path: Path, builtin: Path) -> str:
    if str(cfg.paths.artifacts) != "artifacts" and str(path).startswith("artifacts/"):
        return f" (the built-in one is made under paths.artifacts: {builtin})"
    return ""


def _check_encoder(folder: Path, bad) -> None:
    """features.model names a loadable sentence-encoder folder."""
    if not folder.is_dir():
        bad("features.model", f"must be proxy, target or a local encoder folder; {str(folder)!r} is not a folder")
    if not (folder / "config.json").exists() or not any(folder.glob("*.safetensors")):
        bad("features.model", f"{folder}: not a HF model folder (needs config.json and *.safetensors)")
    if not any((folder / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
        bad("features.model", f"{folder}: no tokenizer files")


def _check_chat_template(folder: Path, bad) -> None:
    """data.chat_template needs a tokenizer that ships one."""
    has = (folder / "chat_template.jinja").exists() or (folder / "chat_template.json").exists()
    tc = folder / "tokenizer_config.json"
    if not has and tc.exists():
        try:
            has = bool(json.loads(tc.read_text(encoding="utf-8")).get("chat_template"))
        except (OSError, ValueError):
            has = False
    if not has:
        bad("data.chat_template", f"{folder}: the tokenizer has no chat template "
            "(no chat_template.jinja, none in tokenizer_config.json)")
