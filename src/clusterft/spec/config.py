"""Typed configuration: one pydantic model per `params.yaml` section, every field's type,
range, allowed values and help text stated once, beside it. `clusterft params`, the README
table and the checks at load all read these fields.

Errors name the file and the dotted key (`params.yaml: train.lr: must be > 0, got -0.1`),
with a suggestion for a misspelt key, so a typo never falls back to a default silently.
Checks against the filesystem (data files, model folders) are `io.preflight`'s. Long
because it states every param once, with its help text and bounds: the sections are data.
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from clusterft.errors import ConfigError
from clusterft.spec.methods import METHODS, time_budgeted
from clusterft.spec.stages import builtin_data_path, builtin_model_path


def _f(default: Any, help: str, why: str = "", **bounds: Any) -> Any:
    """A field with its default, help text (`clusterft params`), bounds (ge, gt, le, lt) and
    `why`: the reason a bound exists, said when a value breaks it."""
    extra = {"why": why} if why else None
    if isinstance(default, (list, dict)):
        return Field(default_factory=lambda d=default: type(d)(d), description=help, json_schema_extra=extra,
                     **bounds)
    return Field(default, description=help, json_schema_extra=extra, **bounds)


class Section(BaseModel):
    """A params.yaml section: unknown keys and wrong types are errors (no coercion)."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)


class PathsConfig(Section):
    artifacts: str = _f("artifacts", "root folder for every stage's outputs")


class DataConfig(Section):
    train: str = _f("artifacts/benchmark/train.jsonl", "training JSONL (Alpaca or chat form); default: "
                    "the built-in benchmark make-benchmark writes under paths.artifacts")
    validation: str = _f("artifacts/benchmark/validation.jsonl", "held-out JSONL (choosing settings, loss)")
    test: str = _f("artifacts/benchmark/test.jsonl", "test JSONL for exact-match evaluation")
    max_length: int = _f(96, "tokens per sample after templating; longer samples are truncated (their "
                         "prompt from the left, keeping the answer's first tokens)", ge=2,
                         why="a sample needs a prompt token and an answer token, or it trains on nothing")
    prompt_template: str = _f("Instruction: {instruction}\n{input_block}Response:",
                              "prompt template; {input_block} is 'Input: <input>\\n' or empty")
    chat_template: bool = _f(False, "render prompts with the model tokenizer's own chat template "
                             "(instruct models); off: prompt_template")
    system_prompt: str = _f("", "chat_template: system message put before every prompt "
                            "(empty: the template's own default)")


class BenchmarkConfig(Section):
    n_train: int = _f(6000, "training samples of the built-in skill mixture", ge=1)
    n_validation: int = _f(400, "validation samples (same mixture as train)", ge=1)
    n_test_per_skill: int = _f(40, "test samples per skill (the test split is balanced)", ge=1)
    zipf_s: float = _f(1.7, "Zipf exponent of skill sizes; head/rarest ratio is n_skills**s")
    duplicate_pool: int = _f(60, "distinct inputs per head skill (near-duplicates beyond it)", ge=1)
    seed: int = _f(0, "generator seed")


class TinyModelConfig(Section):
    hidden_size: int = _f(128, "width of the built-in Llama-architecture model")
    num_layers: int = _f(4, "transformer blocks")
    num_heads: int = _f(4, "attention heads")
    intermediate_size: int = _f(384, "MLP width")
    vocab_size: int = _f(512, "target BPE vocabulary of the locally trained tokenizer")
    seed: int = _f(0, "initialisation seed")


class ModelConfig(Section):
    path: str = _f("artifacts/model/base", "local HF causal-LM folder; default: the built-in tiny model "
                   "prepare-model builds under paths.artifacts")
    gguf_file: str = _f("", "GGUF file inside `path` to load (needs the `gguf` package)")
    trust_remote_code: bool = _f(False, "allow custom modelling code from `path` (off: unsafe)")
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)


class LoraConfig(Section):
    r: int = _f(8, "LoRA rank", ge=1)
    alpha: int = _f(16, "LoRA scaling numerator", gt=0)
    dropout: float = _f(0.0, "LoRA dropout", ge=0, lt=1)
    target_modules: list[str] = _f(["q_proj", "v_proj"], "module names to adapt", min_length=1)


class WarmupConfig(Section):
    fraction: float = _f(0.05, "random fraction of train used for the LoRA warmup", gt=0, le=1)
    epochs: int = _f(2, "passes over the warmup subset", ge=1)
    lr: float = _f(2e-3, "AdamW learning rate", gt=0)
    batch_size: int = _f(16, "samples per optimizer step", ge=1)
    snapshots: int = _f(4, "features.kind loss_traj: evenly spaced warmup snapshots the losses "
                        "are taken at (the last one is the final model)", ge=1)
    seed: int = _f(0, "subset and shuffling seed")


FEATURE_MODELS = ("proxy", "target")


class FeaturesConfig(Section):
    model: str = _f("proxy", "which model computes the features: proxy (a built-in tiny model "
                    "trained from scratch on the data by the warmup stage, seconds; cheap for any "
                    "target size), target (the model being trained, through its LoRA warmup), or "
                    "a local folder of a HF sentence encoder (embedding only)")
    kind: Literal["lora_grad", "lastlayer", "embedding", "loss_traj"] = _f(
        "embedding", "embedding (mean final hidden state over all non-pad tokens), "
        "loss_traj (S2L: the sample's response loss at each warmup snapshot), "
        "lora_grad (per-sample LoRA gradients, LESS-style; target only) or lastlayer "
        "(the paper's last-layer proxy)")
    batch_size: int = _f(64, "samples per forward (and backward) pass", ge=1)
    dim: int = _f(8192, "lora_grad: dimension the gradient is projected to", ge=1)
    projection: Literal["sparse", "rademacher", "gaussian", "none"] = _f(
        "sparse", "lora_grad: sparse (very sparse +-1, 1/sqrt(P) non-zero: always cached, fastest), "
        "rademacher or gaussian (dense, seeded, generated in blocks), or none (store the raw "
        "gradient, one column per LoRA weight)")
    seed: int = _f(0, "lora_grad: projection seed")
    precondition: bool = _f(True, "lora_grad: Adam-precondition with the warmup optimizer's "
                            "moments (as LESS does)")
    projection_cache_mb: int = _f(2048, "lora_grad: keep the whole projection matrix in memory "
                                  "when it fits this cap, else regenerate it block by block", ge=0)
    shard_size: int = _f(512, "samples per shard file: the unit of work split and of resume", ge=1)
    nproc: int = _f(2, "feature workers for `dvc repro` (torchrun --nproc_per_node)", ge=1)

    @model_validator(mode="after")
    def _kind_fits_model(self) -> "FeaturesConfig":
        if self.kind == "lora_grad" and self.model != "target":
            raise ValueError("kind: lora_grad needs features.model: target (the LoRA being trained)")
        if self.model not in FEATURE_MODELS and self.kind != "embedding":
            raise ValueError(f"kind: an encoder folder as features.model gives embedding only, got {self.kind!r}")
        return self


EXACT_KMEANS_ROWS = 50_000  # cluster.backend auto: exact scikit-learn k-means up to this many rows, faiss above


class ClusterConfig(Section):
    k: int | Literal["auto"] = _f(16, "clusters (independent of the workers), or 'auto' (best silhouette)")
    k_min: int = _f(2, "k=auto: smallest K tried", ge=2)
    k_max: int = _f(64, "k=auto: largest K tried")
    auto_sample: int = _f(3000, "k=auto: rows sampled to score each K", ge=2)
    backend: Literal["auto", "sklearn", "faiss"] = _f("auto", f"auto (sklearn up to {EXACT_KMEANS_ROWS // 1000}k rows, "
                                                      "faiss above), sklearn or faiss")
    n_init: int = _f(4, "k-means restarts", ge=1)
    seed: int = _f(0, "k-means seed")

    @field_validator("k", mode="before")
    @classmethod
    def _whole_or_auto(cls, k: Any) -> Any:
        if k == "auto":
            return k
        if isinstance(k, bool) or not isinstance(k, int):
            raise ValueError(f"must be a whole number or 'auto', got {k!r}")
        if k < 1:
            raise ValueError(f"must be >= 1, got {k}")
        return k

    @model_validator(mode="after")
    def _range(self) -> "ClusterConfig":
        if self.k_max < self.k_min:
            raise ValueError(f"k_max: must be >= cluster.k_min ({self.k_min}), got {self.k_max}")
        return self


def _known_methods(cls: type, methods: list[str]) -> list[str]:
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"unknown method {m!r}; known: {', '.join(METHODS)}")
    return methods


class SelectConfig(Section):
    methods: list[str] = _f(["full", "cluster"], "methods the pipeline runs and compares", min_length=1)
    budget: float = _f(0.5, "kept fraction of train (0 < budget <= 1) or a count (> 1)")
    split: Literal["waterfill", "proportional", "power"] = _f(
        "waterfill", "budget split over clusters: waterfill, proportional, power")
    tau: float = _f(0.5, "exponent of the power split: quota ~ n_k^tau (0 = equal, 1 = proportional)", ge=0)
    within: Literal["kcenter", "far", "near", "random"] = _f(
        "kcenter", "which samples a cluster keeps: kcenter, far (from centre), near, random")
    alpha: float = _f(0.5, "weight strength: w = (n_k/m_k)^alpha, 1 = unbiased, 0 = uniform", ge=0)
    dedup: bool = _f(True, "cap each cluster's quota at its number of distinct samples (same "
                     "prompt and answer, whitespace and case aside): copies are pure redundancy, "
                     "the rest of the budget goes to other clusters")
    fill: Literal["copies", "distinct"] = _f(
        "copies", "a budget above the distinct content (dedup on): copies (fill it with copies, split "
        "over the clusters' copies) | distinct (stop at the distinct samples: fewer samples than the budget)")
    paper_ratio: float = _f(0.5, "cluster_paper: every cluster is cut to floor(min size * ratio)", gt=0, le=1)
    seed: int = _f(0, "sampling seed")
    time_budget: float = _f(0.0, "plan the data budget from a time budget instead (0 = off): a fraction "
                            "(<= 1) of the estimated full-data training time, or seconds (> 1), selection "
                            "stages included; sets select.budget (and cluster_dynamic's epochs) for "
                            "random, cluster and cluster_dynamic", ge=0)
    probe_steps: int = _f(12, "time_budget: training steps the probe stage times on the real setup "
                          "(samples of similar size per step, short to long)", ge=3)

    _methods = field_validator("methods")(_known_methods)

    @field_validator("budget")
    @classmethod
    def _budget(cls, b: float) -> float:
        if b <= 0:
            raise ValueError(f"must be > 0 (a fraction in (0, 1] or a count > 1), got {b}")
        if b > 1 and b != int(b):
            raise ValueError(f"a budget above 1 is a sample count and must be whole, got {b}")
        return b


class TrainConfig(Section):
    nproc: int = _f(2, "data-parallel workers (torchrun --nproc_per_node)", ge=1)
    finetune: Literal["full", "lora"] = _f("full", "full (all weights) or lora (adapter on the base model)")
    epochs: int = _f(12, "passes over the selected data", ge=1)
    per_device_batch: int = _f(16, "samples per rank per step", ge=1)
    lr: float = _f(3e-3, "peak learning rate of train.optimizer (cosine decay, linear warmup)", gt=0)
    warmup_ratio: float = _f(0.05, "fraction of steps spent in linear lr warmup", ge=0, lt=1)
    weight_decay: float = _f(0.0, "weight decay of train.optimizer", ge=0)
    seed: int = _f(0, "shuffling and initialisation seed")
    log_every: int = _f(20, "steps between progress lines", ge=1)
    checkpoint_every: int = _f(200, "steps between resumable checkpoints (0 = off)", ge=0)
    max_restarts: int = _f(1, "torchrun restarts after a worker dies (each resumes the checkpoint)", ge=0)
    timeout_s: int = _f(600, "seconds a collective (or the process group's start) may wait for the other "
                        "ranks before the run fails instead of hanging", ge=10)
    infobatch_prune: float = _f(0.5, "infobatch: fraction of below-mean-loss samples skipped per epoch",
                                ge=0, lt=1)
    dynamic_hard: float = _f(0.0, "cluster_dynamic: share of each cluster's epoch quota given to its "
                             "unused samples with the highest latest loss (0 = pure rotation)", ge=0, le=1)
    precision: Literal["fp32", "bf16", "fp16"] = _f(
        "fp32", "fp32 | bf16 | fp16 (loss-scaled): autocast of training and evaluation forwards; the "
        "weights AdamW updates stay fp32")
    fast_loss: bool = _f(True, "the output layer at answer positions only and the prefix every row shares "
                         "(system prompt, chat template) run once per micro-batch: the loss and gradients of full "
                         "logits over whole rows at fewer FLOPs (each path checked against them once; `loss_path_rank0` "
                         "in train metrics says which ran, in order); false: "
                         "full logits, the path of runs recorded before 2026-12-07")
    grad_accum: int = _f(1, "micro-batches per rank per step; their gradients add up to the whole "
                         "step's before the one sync (same update, less activation memory)", ge=1)
    micro_batch_tokens: int = _f(0, "also cut micro-batches until each holds at most this many padded "
                                 "tokens (0 = off): bounded memory when ranks hold uneven counts", ge=0)
    activation_checkpointing: bool = _f(False, "recompute each layer's activations in the backward "
                                        "(less memory, about a third more compute)")
    optimizer: Literal["adamw", "adafactor"] = _f("adamw", "adamw | adafactor (factored second moments: "
                                                  "less optimizer memory)")
    strategy: Literal["ddp", "fsdp"] = _f("ddp", "ddp (a full replica per rank) | fsdp (FSDP2: weights, "
                                          "gradients and optimizer state sharded over ranks; sharded checkpoints)")
    allocation: Literal["balanced", "per_step", "shuffle"] = _f(
        "balanced", "step plan of clustered selections (cluster, cluster_dynamic): balanced (every cluster "
        "within one sample of its share in each step and over every stretch of steps) | per_step (in each "
        "step only: small clusters may come in blocks of steps) | shuffle (random order, as DistributedSampler)")


class EvaluateConfig(Section):
    batch_size: int = _f(64, "prompts per generation batch", ge=1)
    max_new_tokens: int = _f(16, "greedy generation length cap", ge=1)
    split: Literal["test", "validation"] = _f("test", "split scored by exact match: test (report once) or "
                                              "validation (choose settings on it)")
    also_validation: bool = _f(True, "with split test, also score validation (its figures "
                               "choose settings; test is only reported)")
    every: float = _f(0.0, "evaluate during training (0 = off): after every this many steps (> 1, whole) "
                      "or this fraction of the run (<= 1) and at its end, validation exact match and held-out "
                      "loss, sharded over the workers, timed apart from training: accuracy-vs-time curves, "
                      "time to target", ge=0)

    @field_validator("every")
    @classmethod
    def _steps_or_fraction(cls, every: float) -> float:
        if every > 1 and every != int(every):
            raise ValueError(f"above 1 it is a step count and must be whole, got {every}")
        return every


class ExperimentConfig(Section):
    methods: list[str] = _f(["full", "random", "cluster", "cluster_dynamic", "cluster_paper", "infobatch"],
                            "methods compared", min_length=1)
    budgets: list[float] = _f([0.2, 0.3, 0.5], "data budgets (cluster_paper: its ratio r)")
    seeds: list[int] = _f([0, 1, 2], "selection + training seeds per (method, budget)", min_length=1)
    time_budgets: list[float] = _f([], "time budgets (select.time_budget) each of random, cluster and "
                                   "cluster_dynamic also runs with (e.g. [0.3]; a budget no run can meet "
                                   "is refused before any run trains)")
    zero_shot: bool = _f(True, "also score the base model before fine-tuning (the floor)")
    work_pool: str = _f("", "Prefect work pool whose workers take the grid's runs, one flow run each (empty: "
                        "one after the other in this process)")
    worker_timeout: float = _f(120.0, "seconds to wait for a live worker in work_pool before refusing (a "
                               "worker is lost after 3 missed heartbeats, Prefect's own rule)", gt=0)
    attempts: int = _f(3, "submissions of a grid run to the pool after a lost worker or a fault (never "
                       "after bad input)", ge=1)
    results_dir: str = _f("", "folder that keeps each finished grid run's result files (metrics and scores, "
                          "no weights) and gives them back to a grid whose artifacts lack that run under the "
                          "same params and data: commit or share it to finish a grid over several machines or "
                          "sessions (empty: off)")

    _methods = field_validator("methods")(_known_methods)

    @field_validator("budgets")
    @classmethod
    def _fractions(cls, budgets: list[float]) -> list[float]:
        for b in budgets:
            if not 0 < b <= 1:
                raise ValueError(f"each budget must be a fraction in (0, 1], got {b}")
        return budgets

    @field_validator("time_budgets")
    @classmethod
    def _positive(cls, budgets: list[float]) -> list[float]:
        for tb in budgets:
            if tb <= 0:
                raise ValueError(f"each time budget must be > 0 (a fraction <= 1 or seconds), got {tb}")
        return budgets

    @model_validator(mode="after")
    def _every_method_runs(self) -> "ExperimentConfig":
        idle = [m for m in self.methods if METHODS[m].budget is not None and not self.budgets
                and not any(time_budgeted(m, tb) for tb in self.time_budgets)]
        if idle:
            raise ValueError(f"budgets: empty, so {', '.join(idle)} would run nothing; give budgets "
                             "(or time_budgets) or drop them from experiment.methods")
        return self


class TrackingConfig(Section):
    experiment: str = _f("clusterft", "MLflow experiment name")
    tracking_uri: str = _f("sqlite:///mlflow.db", "MLflow store: sqlite:///file.db, a folder, http(s)://server "
                           "(reached before the first stage), postgresql/mysql/mssql://..., databricks; "
                           "env MLFLOW_TRACKING_URI wins")
    live: bool = _f(True, "rank 0 logs each training run to MLflow as it trains (params, dataset, "
                    "per-step curve, model); a crashed run keeps its curve")

    @field_validator("tracking_uri")
    @classmethod
    def _known_store(cls, uri: str) -> str:
        check_tracking_uri(uri)
        return uri


# the stores MLflow's tracking client opens (a scheme may carry a driver: postgresql+psycopg2)
TRACKING_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks",
                    "databricks-uc")


def check_tracking_uri(uri: str) -> str:
    """ValueError unless `uri` is a store MLflow opens: a scheme it knows or a plain path."""
    if not uri.strip():
        raise ValueError("empty; give sqlite:///mlflow.db, a folder or an http(s) server")
    m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", uri)
    if m and len(m.group(1)) > 1 and m.group(1).split("+")[0].lower() not in TRACKING_SCHEMES:
        raise ValueError(f"{uri!r}: unknown store scheme {m.group(1)!r}; MLflow opens "
                         f"{', '.join(TRACKING_SCHEMES)} or a plain folder path")
    return uri


class PipelineConfig(Section):
    paths: PathsConfig = Field(default_factory=PathsConfig)
    benchmark: BenchmarkConfig = Field(default_factory=BenchmarkConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    features: FeaturesConfig = Field(default_factory=FeaturesConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    select: SelectConfig = Field(default_factory=SelectConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    experiment: ExperimentConfig = Field(default_factory=ExperimentConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @model_validator(mode="after")
    def _curves_need_replicas(self) -> "PipelineConfig":
        if self.evaluate.every and self.train.strategy == "fsdp":
            raise ValueError("evaluate.every: evaluation during training needs train.strategy ddp (FSDP "
                             "shards the weights greedy generation reads); set evaluate.every: 0")
        return self

    @model_validator(mode="after")
    def _chat_template_needs_a_real_model(self) -> "PipelineConfig":
        if self.data.chat_template and self.builtin_model:
            raise ValueError("data.chat_template: the built-in tiny model's tokenizer has no chat template; "
                             "set model.path to an instruct model or turn chat_template off")
        return self

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
        return _same(self.model.path, builtin_model_path(self))

    def builtin_split(self, split: str) -> bool:
        """data.<split> is the built-in benchmark's file."""
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
    where = PipelineConfig(paths=PathsConfig(artifacts=str(artifacts)))
    return [f"paths.artifacts={artifacts}", f"model.path={builtin_model_path(where)}",
            *[f"data.{s}={builtin_data_path(where, s)}" for s in ("train", "validation", "test")]]


def _same(a: str | Path, b: str | Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def check_run_name(name: str) -> str:
    """A grid run's folder name: letters, digits, '.', '_' and '-' (never a path)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or ".." in name:
        raise ConfigError(f"run name {name!r}: use letters, digits, '.', '_' and '-' only (no path)")
    return name


# pydantic error types -> our wording ({input}: the value given; ctx keys by name)
_WORDS = {
    "int_type": "expected an integer, got {input!r}", "float_type": "expected a number, got {input!r}",
    "bool_type": "expected true/false, got {input!r}", "string_type": "expected a string, got {input!r}",
    "list_type": "expected a list, got {kind} {input!r}", "model_type": "expected a mapping, got {kind}",
    "literal_error": "must be one of {expected}, got {input!r}",
    "too_short": "must hold at least {min_length} item, got none",
}


BOUNDS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def _interval(field: Any) -> str:
    """A field's allowed range as an interval: (0, inf], [0, 1), ..."""
    lo = hi = None
    lo_in = hi_in = True
    for m in field.metadata:
        for attr, closed in (("gt", False), ("ge", True), ("lt", False), ("le", True)):
            v = getattr(m, attr, None)
            if v is None:
                continue
            if attr in ("gt", "ge"):
                lo, lo_in = v, closed
            else:
                hi, hi_in = v, closed
    return (f"{'[' if lo_in and lo is not None else '('}{'-inf' if lo is None else lo}, "
            f"{'inf' if hi is None else hi}{']' if hi_in else ')'}")


def _key_and_message(err: dict[str, Any]) -> tuple[str, str]:
    """(dotted key, message) of one pydantic error, in params.yaml's terms."""
    key, model, field = "", PipelineConfig, None
    for part in err["loc"]:
        if isinstance(part, int):
            key += f"[{part}]"
        elif model is not None and part in model.model_fields:
            key += ("." if key else "") + part
            field = model.model_fields[part]
            ann = field.annotation
            model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        elif err["type"] == "extra_forbidden":
            known = list(model.model_fields) if model else []
            hint = difflib.get_close_matches(str(part), known, n=1)
            suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
            return (key + "." if key else "") + str(part), f"unknown key{suggestion}; known: {', '.join(known)}"
        else:
            break  # a union member's tag
    if err["type"] in ("value_error", "assertion_error"):
        msg = str(err["ctx"]["error"]) if "ctx" in err else err["msg"]
        field = re.match(r"([a-z_]+): ", msg)  # a model validator naming one of its fields
        if field and model is not None and field.group(1) in model.model_fields:
            return f"{key}.{field.group(1)}", msg[field.end():]
        if re.match(r"[a-z_]+\.[a-z_.]+: ", msg):  # a root validator naming a dotted key
            return msg.split(": ", 1)[0], msg.split(": ", 1)[1]
        return key, msg
    if err["type"] in BOUNDS and field is not None:
        why = (field.json_schema_extra or {}).get("why")
        return key, f"must be in {_interval(field)}, got {err.get('input')}" + (f" ({why})" if why else "")
    words = _WORDS.get(err["type"], err["msg"])
    ctx = {k: v for k, v in (err.get("ctx") or {}).items()}
    return key, words.format(input=err.get("input"), kind=type(err.get("input")).__name__, **ctx)


def _lone_surrogate(rec: Any) -> tuple[str, str] | None:
    """(field path, code point) of the first string in a parsed record holding a lone UTF-16
    surrogate (a JSON escape such as \\ud800 without its pair: not a character, so no text
    encoding can hold it), else None. Iterative: a deeply nested record cannot overflow it."""
    todo: list[tuple[str, Any]] = [("", rec)]
    while todo:
        path, v = todo.pop()
        if isinstance(v, dict):
            todo += [(f"{path}.{k}" if path else str(k), x) for k, x in v.items()]
            todo += [(f"{path}.<key>" if path else "<key>", k) for k in v]
        elif isinstance(v, list):
            todo += [(f"{path}[{i}]", x) for i, x in enumerate(v)]
        elif isinstance(v, str):
            bad = next((c for c in v if 0xD800 <= ord(c) <= 0xDFFF), None)
            if bad is not None:
                return path, f"U+{ord(bad):04X}"
    return None


def _yaml(text: str, where: str) -> Any:
    """YAML text as a value; ConfigError naming `where` for bad YAML, nesting past Python's
    recursion limit and strings holding a lone surrogate (not a character)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: invalid YAML: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"{where}: invalid YAML: {too_deep()}") from None
    problem = surrogate_problem(value)
    if problem:
        raise ConfigError(f"{where}: {problem}")
    return value


def too_deep() -> str:
    """Why a text nested past Python's recursion limit is refused."""
    return f"nested too deeply (more than about {sys.getrecursionlimit()} levels of lists or mappings)"


def surrogate_problem(value: Any) -> str | None:
    """What is wrong with a parsed value holding a lone surrogate (naming its field), else None."""
    found = _lone_surrogate(value)
    if not found:
        return None
    field = f"field '{found[0]}' " if found[0] else ""
    return (f"{field}holds {found[1]}, a lone surrogate: not a character (a \\ud800-\\udfff escape must "
            "come in a high-low pair)")


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key.path=value")
    key, raw = text.split("=", 1)
    return key.strip().split("."), _yaml(raw, f"override {key.strip()}") if raw != "" else ""


def _read(path: str | Path | None) -> tuple[dict[str, Any], str]:
    if path is None:
        return {}, "defaults"
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p}: is a folder, not a params file (name the params.yaml inside it)")
    if not p.exists():
        raise ConfigError(f"{p}: params file not found")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not valid UTF-8 (byte {exc.start})") from None
    raw = _yaml(text, str(p)) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: top level must be a mapping of sections")
    return raw, str(p)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """Load `params.yaml` (or defaults when path is None) plus `a.b=value` overrides; every
    value is checked here (the filesystem is checked by io.preflight)."""
    raw, label = _read(path)
    for text in overrides or []:
        keys, value = _parse_override(text)
        node = raw
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {k} is not a section")
        node[keys[-1]] = value
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        key, message = _key_and_message(exc.errors()[0])
        raise ConfigError(f"{label}: {key}: {message}") from None


def params_help() -> list[tuple[str, Any, str]]:
    """(dotted key, default, help) of every param, in params.yaml's order."""
    out: list[tuple[str, Any, str]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
            else:
                out.append((f"{prefix}{name}", f.get_default(call_default_factory=True), f.description or ""))

    walk(PipelineConfig, "")
    return out


def params_markdown() -> str:
    """Every param as a markdown table (the README's reference, generated: `clusterft params
    --markdown`)."""
    rows = [f"| `{key}` | `{default!r}` | {help_text.replace('|', '/')} |" for key, default, help_text in params_help()]
    return "| param | default | what it sets |\n|---|---|---|\n" + "\n".join(rows) + "\n"


def to_dict(cfg: BaseModel) -> dict[str, Any]:
    """Plain nested dict (for MLflow params, digests and manifests)."""
    return cfg.model_dump()


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
