"""A loaded config checked against the filesystem before any stage spends time: your own
data files and model folder exist and are usable, an encoder folder is one, a chat
template is there to render with. (The built-in data and model are made by their stages.)
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

from clusterft.core.tokens import Renderer
from clusterft.errors import ConfigError
from clusterft.io.examples import load_jsonl
from clusterft.io.models import check_model_files
from clusterft.spec.config import FEATURE_MODELS, PipelineConfig, check_tracking_uri, load_config
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
            if path.is_dir():
                bad(f"data.{s}", f"{path}: is a folder, not a data file (name the .jsonl file inside it)")
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
    _check_tracking_store(cfg, bad)
    if cfg.evaluate.every and not cfg.builtin_split("validation"):
        validation = load_jsonl(cfg.data.validation, Renderer(cfg.data.prompt_template))
        if not any(x.scored for x in validation):
            bad("evaluate.every", f"curves score exact match on {cfg.data.validation}, which has no record to "
                "score (every one has \"exact_match\": false); add scored records or set evaluate.every: 0")


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


def _check_tracking_store(cfg: PipelineConfig, bad) -> None:
    """The MLflow store the runs will log to: env MLFLOW_TRACKING_URI (it wins) must name a
    store MLflow opens, and an http(s) server must answer before any stage spends time (a
    store that fails later is only a warning: tracking never stops training)."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    key = "MLFLOW_TRACKING_URI (environment)" if env else "tracking.tracking_uri"
    uri = env or cfg.tracking.tracking_uri
    try:
        check_tracking_uri(uri)
    except ValueError as exc:
        bad(key, str(exc))
    if uri.lower().startswith(("http://", "https://")):
        health = uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(health, timeout=TRACKING_TIMEOUT_S) as r:  # noqa: S310 (http(s) only)
                r.read(64)
        except (OSError, ValueError) as exc:
            bad(key, f"{uri}: the MLflow server does not answer ({health}: {getattr(exc, 'reason', exc)}); "
                "start it with: mlflow server --host 127.0.0.1 --port 5000; or point the key at sqlite:///mlflow.db")


TRACKING_TIMEOUT_S = 5  # seconds an http(s) tracking server has to answer /health
