"""Typed configuration: one dataclass per stage, loaded strictly from `params.yaml`.

Unknown keys and wrong types are errors that name the file and the key, so a typo in
`params.yaml` never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from clusterft.methods import METHODS


class ConfigError(ValueError):
    """A params file (or override) is malformed: message names file and key."""


def _f(default: Any, help: str) -> Any:
    """A dataclass field with a default and help text (shown by `clusterft params`)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class PathsConfig:
    artifacts: str = _f("artifacts", "root folder for every stage's outputs")


@dataclass
class DataConfig:
    train: str = _f("artifacts/benchmark/train.jsonl", "training JSONL (Alpaca or chat form); default: "
                    "the built-in benchmark make-benchmark writes under paths.artifacts")
    validation: str = _f("artifacts/benchmark/validation.jsonl", "held-out JSONL (choosing settings, loss)")
    test: str = _f("artifacts/benchmark/test.jsonl", "test JSONL for exact-match evaluation")
    max_length: int = _f(96, "tokens per sample after templating; longer samples are truncated")
    prompt_template: str = _f(
        "Instruction: {instruction}\n{input_block}Response:",
        "prompt template; {input_block} is 'Input: <input>\\n' or empty",
    )
    chat_template: bool = _f(False, "render prompts with the model tokenizer's own chat template "
                             "(instruct models); off: prompt_template")
    system_prompt: str = _f("", "chat_template: system message put before every prompt "
                            "(empty: the template's own default)")


@dataclass
class BenchmarkConfig:
    n_train: int = _f(6000, "training samples of the built-in skill mixture")
    n_validation: int = _f(400, "validation samples (same mixture as train)")
    n_test_per_skill: int = _f(40, "test samples per skill (the test split is balanced)")
    zipf_s: float = _f(1.7, "Zipf exponent of skill sizes; head/rarest ratio is n_skills**s")
    duplicate_pool: int = _f(60, "distinct inputs per head skill (near-duplicates beyond it)")
    seed: int = _f(0, "generator seed")


@dataclass
class TinyModelConfig:
    hidden_size: int = _f(128, "width of the built-in Llama-architecture model")
    num_layers: int = _f(4, "transformer blocks")
    num_heads: int = _f(4, "attention heads")
    intermediate_size: int = _f(384, "MLP width")
    vocab_size: int = _f(512, "target BPE vocabulary of the locally trained tokenizer")
    seed: int = _f(0, "initialisation seed")


@dataclass
class ModelConfig:
    path: str = _f("artifacts/model/base", "local HF causal-LM folder; default: the built-in tiny model "
                   "prepare-model builds under paths.artifacts")
    gguf_file: str = _f("", "GGUF file inside `path` to load (needs the `gguf` package)")
    trust_remote_code: bool = _f(False, "allow custom modelling code from `path` (off: unsafe)")
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)


@dataclass
class LoraConfig:
    r: int = _f(8, "LoRA rank")
    alpha: int = _f(16, "LoRA scaling numerator")
    dropout: float = _f(0.0, "LoRA dropout")
    target_modules: list[str] = _f(["q_proj", "v_proj"], "module names to adapt")


@dataclass
class WarmupConfig:
    fraction: float = _f(0.05, "random fraction of train used for the LoRA warmup")
    epochs: int = _f(2, "passes over the warmup subset")
    lr: float = _f(2e-3, "AdamW learning rate")
    batch_size: int = _f(16, "samples per optimizer step")
    snapshots: int = _f(4, "features.kind loss_traj: evenly spaced warmup snapshots the losses "
                        "are taken at (the last one is the final model)")
    seed: int = _f(0, "subset and shuffling seed")


@dataclass
class FeaturesConfig:
    model: str = _f("proxy", "which model computes the features: proxy (a built-in tiny model "
                    "trained from scratch on the data by the warmup stage, seconds; cheap for any "
                    "target size), target (the model being trained, through its LoRA warmup), or "
                    "a local folder of a HF sentence encoder (embedding only)")
    kind: str = _f("embedding", "embedding (mean final hidden state over all non-pad tokens), "
                   "loss_traj (S2L: the sample's response loss at each warmup snapshot), "
                   "lora_grad (per-sample LoRA gradients, LESS-style; target only) or lastlayer "
                   "(the paper's last-layer proxy)")
    batch_size: int = _f(64, "samples per forward (and backward) pass")
    dim: int = _f(8192, "lora_grad: dimension the gradient is projected to")
    projection: str = _f("sparse", "lora_grad: sparse (very sparse +-1, 1/sqrt(P) non-zero: "
                         "always cached, fastest), rademacher or gaussian (dense, seeded, generated "
                         "in blocks), or none (store the raw gradient, one column per LoRA weight)")
    seed: int = _f(0, "lora_grad: projection seed")
    precondition: bool = _f(True, "lora_grad: Adam-precondition with the warmup optimizer's "
                            "moments (as LESS does)")
    projection_cache_mb: int = _f(2048, "lora_grad: keep the whole projection matrix in memory "
                                  "when it fits this cap, else regenerate it block by block")
    shard_size: int = _f(512, "samples per shard file: the unit of work split and of resume")
    nproc: int = _f(2, "feature workers for `dvc repro` (torchrun --nproc_per_node)")


@dataclass
class ClusterConfig:
    k: int | str = _f(16, "clusters (independent of the workers), or 'auto' (best silhouette)")
    k_min: int = _f(2, "k=auto: smallest K tried")
    k_max: int = _f(64, "k=auto: largest K tried")
    auto_sample: int = _f(3000, "k=auto: rows sampled to score each K")
    backend: str = _f("auto", "auto (sklearn up to 50k rows, faiss above), sklearn or faiss")
    n_init: int = _f(4, "k-means restarts")
    seed: int = _f(0, "k-means seed")


@dataclass
class SelectConfig:
    methods: list[str] = _f(["full", "cluster"], "methods the pipeline runs and compares")
    budget: float = _f(0.5, "kept fraction of train (0 < budget <= 1) or a count (> 1)")
    split: str = _f("waterfill", "budget split over clusters: waterfill, proportional, power")
    tau: float = _f(0.5, "exponent of the power split: quota ~ n_k^tau (0 = equal, 1 = proportional)")
    within: str = _f("kcenter", "which samples a cluster keeps: kcenter, far (from centre), near, random")
    alpha: float = _f(0.5, "weight strength: w = (n_k/m_k)^alpha, 1 = unbiased, 0 = uniform")
    dedup: bool = _f(True, "cap each cluster's quota at its number of distinct samples (same "
                     "prompt and answer, whitespace and case aside): copies are pure redundancy, "
                     "the rest of the budget goes to other clusters")
    fill: str = _f("copies", "a budget above the distinct content (dedup on): copies (fill it with "
                   "copies, split over the clusters' copies) | distinct (stop at the distinct samples: "
                   "fewer samples than the budget)")
    paper_ratio: float = _f(0.5, "cluster_paper: every cluster is cut to floor(min size * ratio)")
    seed: int = _f(0, "sampling seed")
    time_budget: float = _f(0.0, "plan the data budget from a time budget instead (0 = off): a fraction "
                            "(<= 1) of the estimated full-data training time, or seconds (> 1), selection "
                            "stages included; sets select.budget (and cluster_dynamic's epochs) for "
                            "random, cluster and cluster_dynamic")
    probe_steps: int = _f(12, "time_budget: training steps the probe stage times on the real setup "
                          "(samples of similar size per step, short to long)")


@dataclass
class TrainConfig:
    nproc: int = _f(2, "data-parallel workers (torchrun --nproc_per_node)")
    finetune: str = _f("full", "full (all weights) or lora (adapter on the base model)")
    epochs: int = _f(12, "passes over the selected data")
    per_device_batch: int = _f(16, "samples per rank per step")
    lr: float = _f(3e-3, "peak AdamW learning rate (cosine decay, linear warmup)")
    warmup_ratio: float = _f(0.05, "fraction of steps spent in linear lr warmup")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    seed: int = _f(0, "shuffling and initialisation seed")
    log_every: int = _f(20, "steps between progress lines")
    checkpoint_every: int = _f(200, "steps between resumable checkpoints (0 = off)")
    max_restarts: int = _f(1, "torchrun restarts after a worker dies (each resumes the checkpoint)")
    timeout_s: int = _f(600, "seconds a collective (or the process group's start) may wait for the other "
                        "ranks before the run fails instead of hanging")
    infobatch_prune: float = _f(0.5, "infobatch: fraction of below-mean-loss samples skipped per epoch")
    dynamic_hard: float = _f(0.0, "cluster_dynamic: share of each cluster's epoch quota given to its "
                             "unused samples with the highest latest loss (0 = pure rotation)")
    precision: str = _f("fp32", "fp32 | bf16 | fp16 (loss-scaled): autocast of training and evaluation "
                        "forwards; the weights AdamW updates stay fp32")
    grad_accum: int = _f(1, "micro-batches per rank per step; their gradients add up to the whole "
                         "step's before the one sync (same update, less activation memory)")
    micro_batch_tokens: int = _f(0, "also cut micro-batches until each holds at most this many padded "
                                 "tokens (0 = off): bounded memory when ranks hold uneven counts")
    activation_checkpointing: bool = _f(False, "recompute each layer's activations in the backward "
                                        "(less memory, about a third more compute)")
    optimizer: str = _f("adamw", "adamw | adafactor (factored second moments: less optimizer memory)")
    strategy: str = _f("ddp", "ddp (a full replica per rank) | fsdp (FSDP2: weights, gradients and "
                       "optimizer state sharded over ranks; sharded checkpoints)")
    allocation: str = _f("balanced", "step plan of clustered selections (cluster, cluster_dynamic): balanced "
                         "(every cluster within one sample of its share in each step and over every "
                         "stretch of steps) | per_step (in each step only: small clusters may come in "
                         "blocks of steps) | shuffle (random order, as DistributedSampler)")


@dataclass
class EvaluateConfig:
    batch_size: int = _f(64, "prompts per generation batch")
    max_new_tokens: int = _f(16, "greedy generation length cap")
    split: str = _f("test", "split scored by exact match: test (report once) or validation "
                    "(choose settings on it)")
    also_validation: bool = _f(True, "with split test, also score validation (its figures "
                               "choose settings; test is only reported)")


@dataclass
class ExperimentConfig:
    methods: list[str] = _f(["full", "random", "cluster", "cluster_dynamic", "cluster_paper", "infobatch"],
                            "methods compared")
    budgets: list[float] = _f([0.2, 0.3, 0.5], "data budgets (cluster_paper: its ratio r)")
    seeds: list[int] = _f([0, 1, 2], "selection + training seeds per (method, budget)")
    time_budgets: list[float] = _f([], "time budgets (select.time_budget) each of random, cluster and "
                                   "cluster_dynamic also runs with (e.g. [0.3]; a budget no run can meet "
                                   "is refused before any run trains)")
    zero_shot: bool = _f(True, "also score the base model before fine-tuning (the floor)")


@dataclass
class TrackingConfig:
    experiment: str = _f("clusterft", "MLflow experiment name")
    tracking_uri: str = _f("sqlite:///mlflow.db", "MLflow store; env MLFLOW_TRACKING_URI wins")
    live: bool = _f(True, "rank 0 logs each training run to MLflow as it trains (params, dataset, "
                    "per-step curve, model); a crashed run keeps its curve")


@dataclass
class PipelineConfig:
    paths: PathsConfig = field(default_factory=PathsConfig)
    benchmark: BenchmarkConfig = field(default_factory=BenchmarkConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    select: SelectConfig = field(default_factory=SelectConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def artifact(self, *parts: str) -> Path:
        """Path under the artifacts root."""
        return Path(self.paths.artifacts).joinpath(*parts)

    def method_dir(self, method: str, run: str | None = None) -> Path:
        """Outputs of one method's select/allocate/train/evaluate: methods/<method>, or
        experiments/<run> for a named run of an experiment grid."""
        if method not in METHODS:
            raise ConfigError(f"method {method!r}: unknown; known: {', '.join(METHODS)}")
        if run is not None:
            check_run_name(run)
        return self.artifact("experiments", run) if run else self.artifact("methods", method)

    @property
    def builtin_model(self) -> bool:
        """model.path is where prepare-model builds the built-in tiny model."""
        from clusterft.stages import builtin_model_path

        return _same(self.model.path, builtin_model_path(self))

    def builtin_split(self, split: str) -> bool:
        """data.<split> is the built-in benchmark's file."""
        from clusterft.stages import builtin_data_path

        return _same(getattr(self.data, split), builtin_data_path(self, split))

    def value(self, key: str) -> Any:
        """The param at dotted `key`, e.g. cfg.value("train.nproc")."""
        obj: Any = self
        for part in key.split("."):
            obj = getattr(obj, part)
        return obj


def relocate(artifacts: str | Path) -> list[str]:
    """Overrides that move paths.artifacts and the built-in data and model with it (where
    the stage table puts them)."""
    from types import SimpleNamespace

    from clusterft.stages import builtin_data_path, builtin_model_path

    where = SimpleNamespace(paths=SimpleNamespace(artifacts=str(artifacts)))
    return [f"paths.artifacts={artifacts}", f"model.path={builtin_model_path(where)}",
            *[f"data.{s}={builtin_data_path(where, s)}" for s in ("train", "validation", "test")]]


def _same(a: str | Path, b: str | Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def check_run_name(name: str) -> str:
    """A grid run's folder name: letters, digits, '.', '_' and '-' (never a path)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or ".." in name:
        raise ConfigError(f"run name {name!r}: use letters, digits, '.', '_' and '-' only (no path)")
    return name


def _check_value(value: Any, tp: Any, where: str) -> Any:
    """Coerce/verify one leaf value against its annotated type."""
    origin = typing.get_origin(tp)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        return [_check_value(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(tp):
            try:
                return _check_value(value, option, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: {value!r} does not match {tp}")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported type {tp}")


def _build(cls: type, data: Any, where: str) -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and wrong types."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        key_where = f"{where}.{key}" if not where.endswith(":") else f"{where} {key}"
        if key not in names:
            hint = difflib.get_close_matches(str(key), names, n=1)
            suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise ConfigError(f"{key_where}: unknown key{suggestion}; known: {', '.join(names)}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, key_where)
        else:
            kwargs[key] = _check_value(value, tp, key_where)
    return cls(**kwargs)


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key.path=value")
    key, raw = text.split("=", 1)
    return key.strip().split("."), yaml.safe_load(raw) if raw != "" else ""


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """Load `params.yaml` (or defaults when path is None) plus `a.b=value` overrides."""
    raw: dict[str, Any] = {}
    label = "defaults"
    if path is not None:
        p = Path(path)
        label = str(p)
        if not p.exists():
            raise ConfigError(f"{p}: params file not found")
        try:
            raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: invalid YAML: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"{p}: top level must be a mapping of sections")
    for text in overrides or []:
        keys, value = _parse_override(text)
        node = raw
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {k} is not a section")
        node[keys[-1]] = value
    cfg = _build(PipelineConfig, raw, f"{label}:")
    validate(cfg, label)
    return cfg


def validate(cfg: PipelineConfig, label: str = "params") -> None:
    """Range checks that types alone cannot express."""

    def bad(key: str, msg: str) -> None:
        raise ConfigError(f"{label}: {key}: {msg}")

    if not 0 < cfg.warmup.fraction <= 1:
        bad("warmup.fraction", f"must be in (0, 1], got {cfg.warmup.fraction}")
    b = cfg.select.budget
    if b <= 0:
        bad("select.budget", f"must be > 0 (a fraction in (0, 1] or a count > 1), got {b}")
    if b > 1 and b != int(b):
        bad("select.budget", f"a budget above 1 is a sample count and must be whole, got {b}")
    if isinstance(cfg.cluster.k, str) and cfg.cluster.k != "auto":
        bad("cluster.k", f"must be a whole number or 'auto', got {cfg.cluster.k!r}")
    if isinstance(cfg.cluster.k, int) and cfg.cluster.k < 1:
        bad("cluster.k", f"must be >= 1, got {cfg.cluster.k}")
    if cfg.train.nproc < 1:
        bad("train.nproc", f"must be >= 1, got {cfg.train.nproc}")
    _check_inputs(cfg, bad)
    if cfg.train.finetune not in ("full", "lora"):
        bad("train.finetune", f"must be 'full' or 'lora', got {cfg.train.finetune!r}")
    if cfg.features.kind not in FEATURE_KINDS:
        bad("features.kind", f"must be one of {FEATURE_KINDS}, got {cfg.features.kind!r}")
    _check_ranges(cfg, bad)
    _check_feature_model(cfg, bad)
    if cfg.data.chat_template:
        _check_chat_template(cfg, bad)
    if cfg.evaluate.split not in ("test", "validation"):
        bad("evaluate.split", f"must be 'test' or 'validation', got {cfg.evaluate.split!r}")
    if cfg.warmup.snapshots < 1:
        bad("warmup.snapshots", f"must be >= 1, got {cfg.warmup.snapshots}")
    if cfg.features.projection not in FEATURE_PROJECTIONS:
        bad("features.projection",
            f"must be one of {FEATURE_PROJECTIONS}, got {cfg.features.projection!r}")
    if cfg.features.projection_cache_mb < 0:
        bad("features.projection_cache_mb", "must be >= 0")
    for key, methods in (("select.methods", cfg.select.methods), ("experiment.methods", cfg.experiment.methods)):
        for m in methods:
            if m not in METHODS:
                bad(key, f"unknown method {m!r}; known: {', '.join(METHODS)}")
    for b in cfg.experiment.budgets:
        if not 0 < b <= 1:
            bad("experiment.budgets", f"each budget must be a fraction in (0, 1], got {b}")
    for tb in cfg.experiment.time_budgets:
        if tb <= 0:
            bad("experiment.time_budgets", f"each time budget must be > 0 (a fraction <= 1 or seconds), got {tb}")
    for key in ("train.epochs", "train.per_device_batch", "warmup.epochs", "warmup.batch_size",
                "data.max_length", "features.batch_size", "features.dim", "features.shard_size",
                "features.nproc", "evaluate.batch_size"):
        if cfg.value(key) < 1:
            bad(key, "must be >= 1")


def _check_inputs(cfg: PipelineConfig, bad: Any) -> None:
    """Your own data files and model folder exist (the built-in ones are made by their
    stages), before any stage spends time."""
    from clusterft.stages import builtin_data_path, builtin_model_path

    own = [s for s in ("train", "validation", "test") if not cfg.builtin_split(s)]
    for s in own:
        path = Path(getattr(cfg.data, s))
        if not path.is_file():
            bad(f"data.{s}", f"{path}: file not found" + _default_hint(cfg, path, builtin_data_path(cfg, s)))
    if not cfg.builtin_model:
        folder = Path(cfg.model.path)
        if not folder.is_dir():
            bad("model.path", f"{folder}: model folder not found"
                + _default_hint(cfg, folder, builtin_model_path(cfg)))
        model_files_problem = check_model_files(folder, cfg.model.gguf_file)
        if model_files_problem:
            bad("model.path", model_files_problem)


def _default_hint(cfg: PipelineConfig, path: Path, builtin: Path) -> str:
    if str(cfg.paths.artifacts) != "artifacts" and str(path).startswith("artifacts/"):
        return f" (the built-in one is made under paths.artifacts: {builtin})"
    return ""


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


def _check_feature_model(cfg: PipelineConfig, bad: Any) -> None:
    """features.model is proxy, target or a loadable encoder folder, and fits features.kind."""
    fm, kind = cfg.features.model, cfg.features.kind
    if fm in FEATURE_MODELS:
        if kind == "lora_grad" and fm != "target":
            bad("features.kind", "lora_grad needs features.model: target (the LoRA being trained)")
        return
    folder = Path(fm)
    if not folder.is_dir():
        bad("features.model", f"must be proxy, target or a local encoder folder; {fm!r} is not a folder")
    if not (folder / "config.json").exists() or not any(folder.glob("*.safetensors")):
        bad("features.model", f"{fm}: not a HF model folder (needs config.json and *.safetensors)")
    if not any((folder / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
        bad("features.model", f"{fm}: no tokenizer files")
    if kind != "embedding":
        bad("features.kind", f"an encoder folder as features.model gives embedding only, got {kind!r}")


def _check_chat_template(cfg: PipelineConfig, bad: Any) -> None:
    """data.chat_template needs a tokenizer that ships one (the built-in tokenizer has none)."""
    if cfg.builtin_model:
        bad("data.chat_template", "the built-in tiny model's tokenizer has no chat template; "
            "set model.path to an instruct model or turn chat_template off")
    folder = Path(cfg.model.path)
    if cfg.model.gguf_file or not folder.is_dir():
        return  # GGUF templates are read at load; a missing folder is model.path's error
    import json

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


# Ranges every numeric param must satisfy, checked at load (key: (low, high, inclusive?)).
# None = unbounded; a bool pair says whether each bound itself is allowed.
RANGES: dict[str, tuple[float | None, float | None, tuple[bool, bool]]] = {
    "warmup.lr": (0, None, (False, True)), "train.lr": (0, None, (False, True)),
    "train.warmup_ratio": (0, 1, (True, False)), "train.weight_decay": (0, None, (True, True)),
    "train.log_every": (1, None, (True, True)), "train.checkpoint_every": (0, None, (True, True)),
    "train.max_restarts": (0, None, (True, True)), "train.timeout_s": (10, None, (True, True)),
    "train.infobatch_prune": (0, 1, (True, False)), "train.grad_accum": (1, None, (True, True)),
    "train.micro_batch_tokens": (0, None, (True, True)),
    "train.dynamic_hard": (0, 1, (True, True)),
    "select.time_budget": (0, None, (True, True)), "select.probe_steps": (3, None, (True, True)),
    "select.alpha": (0, None, (True, True)), "select.tau": (0, None, (True, True)),
    "select.paper_ratio": (0, 1, (False, True)), "lora.r": (1, None, (True, True)),
    "lora.alpha": (0, None, (False, True)), "lora.dropout": (0, 1, (True, False)),
    "evaluate.max_new_tokens": (1, None, (True, True)), "cluster.n_init": (1, None, (True, True)),
    "cluster.k_min": (2, None, (True, True)), "cluster.auto_sample": (2, None, (True, True)),
    "benchmark.n_train": (1, None, (True, True)), "benchmark.n_test_per_skill": (1, None, (True, True)),
}
ENUMS = {"select.split": ("waterfill", "proportional", "power"), "select.fill": ("copies", "distinct"),
         "select.within": ("kcenter", "far", "near", "random"),
         "cluster.backend": ("auto", "sklearn", "faiss"), "train.precision": ("fp32", "bf16", "fp16"),
         "train.strategy": ("ddp", "fsdp"), "train.allocation": ("balanced", "per_step", "shuffle"),
         "train.optimizer": ("adamw", "adafactor")}


def _check_ranges(cfg: PipelineConfig, bad: Any) -> None:
    """Every key of RANGES within its bounds, every key of ENUMS one of its values."""
    for key, (lo, hi, (lo_in, hi_in)) in RANGES.items():
        v = cfg.value(key)
        below = lo is not None and (v < lo or (v == lo and not lo_in))
        above = hi is not None and (v > hi or (v == hi and not hi_in))
        if below or above:
            span = f"{'[' if lo_in else '('}{lo if lo is not None else '-inf'}, " \
                   f"{hi if hi is not None else 'inf'}{']' if hi_in else ')'}"
            bad(key, f"must be in {span}, got {v}")
    for key, allowed in ENUMS.items():
        if cfg.value(key) not in allowed:
            bad(key, f"must be one of {allowed}, got {cfg.value(key)!r}")
    if cfg.cluster.k_max < cfg.cluster.k_min:
        bad("cluster.k_max", f"must be >= cluster.k_min ({cfg.cluster.k_min}), got {cfg.cluster.k_max}")


FEATURE_MODELS = ("proxy", "target")
FEATURE_KINDS = ("lora_grad", "lastlayer", "embedding", "loss_traj")
FEATURE_PROJECTIONS = ("sparse", "rademacher", "gaussian", "none")


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict (for MLflow params and manifests)."""
    return dataclasses.asdict(cfg)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
