"""Models: the built-in tiny Llama + locally trained tokenizer, local HF folders, LoRA, and
the model a training run starts from and saves.

Weights are read only from local folders (`local_files_only`), from safetensors (or a GGUF
file when asked); custom modelling code runs only when `model.trust_remote_code` is set.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any, Iterable

import torch

from clusterft.errors import ModelError
from clusterft.io.artifacts import ensure_dir
from clusterft.io.models import check_model_files
from clusterft.runtime import parallel
from clusterft.spec.config import LoraConfig, ModelConfig, PipelineConfig, TinyModelConfig

log = logging.getLogger(__name__)
PAD, EOS = "<|pad|>", "<|eos|>"


def hub_offline() -> None:
    """Keep the Hugging Face libraries off the network and quiet in this process: called where
    a stage loads a model (importing clusterft changes nothing; every load is also
    local_files_only, which holds whenever the libraries were imported)."""
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
                       ("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)

def base_model_dir(cfg: PipelineConfig) -> Path:
    """The user's model folder, or where the built-in model is built."""
    return Path(cfg.model.path)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """Byte-level BPE trained on `texts`, with pad and eos special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS)


def build_tiny_model(cfg: TinyModelConfig, tokenizer: Any, max_length: int) -> torch.nn.Module:
    """A randomly initialised Llama-architecture causal LM sized by `cfg`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),  # trained vocab can be smaller than asked
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=max(256, 2 * max_length),
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config)


def prepare_builtin(cfg: PipelineConfig, texts: Iterable[str], out_dir: str | Path) -> dict:
    """Train the tokenizer on `texts`, build the tiny model, save both (safetensors)."""
    out = ensure_dir(out_dir)
    tokenizer = train_tokenizer(texts, cfg.model.tiny.vocab_size)
    model = build_tiny_model(cfg.model.tiny, tokenizer, cfg.data.max_length)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    return {"n_params": n_params, "vocab_size": len(tokenizer), "dir": str(out)}


def _check_model_dir(path: Path, mcfg: ModelConfig) -> None:
    if not path.is_dir():
        raise ModelError(f"{path}: model folder not found (model.path)")
    problem = check_model_files(path, mcfg.gguf_file)
    if problem:
        raise ModelError(problem)


def load_tokenizer(path: str | Path, mcfg: ModelConfig | None = None) -> Any:
    """Tokenizer from a local folder; a missing pad token falls back to EOS (logged)."""
    from transformers import AutoTokenizer

    hub_offline()
    mcfg = mcfg or ModelConfig()
    _check_model_dir(Path(path), mcfg)
    kwargs: dict[str, Any] = {"trust_remote_code": mcfg.trust_remote_code, "local_files_only": True}
    if mcfg.gguf_file:
        kwargs["gguf_file"] = mcfg.gguf_file
    elif not any((Path(path) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise ModelError(f"{path}: no tokenizer files (tokenizer.json / tokenizer_config.json)")
    tok = AutoTokenizer.from_pretrained(str(path), **kwargs)
    if tok.eos_token_id is None:
        raise ModelError(f"{path}: tokenizer has no eos token; set one in tokenizer_config.json")
    if tok.pad_token_id is None:
        log.warning("%s: tokenizer has no pad token; using its eos token for padding", path)
        tok.pad_token = tok.eos_token
    return tok


def load_model(path: str | Path, mcfg: ModelConfig | None = None) -> torch.nn.Module:
    """Causal LM from a local folder, fp32, safetensors only (or GGUF when configured)."""
    from transformers import AutoModelForCausalLM

    hub_offline()
    mcfg = mcfg or ModelConfig()
    p = Path(path)
    _check_model_dir(p, mcfg)
    kwargs: dict[str, Any] = {"dtype": torch.float32, "trust_remote_code": mcfg.trust_remote_code,
                              "local_files_only": True}
    if mcfg.gguf_file:
        kwargs["gguf_file"] = mcfg.gguf_file
    else:
        kwargs["use_safetensors"] = True
    return AutoModelForCausalLM.from_pretrained(str(p), **kwargs)


def add_lora(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """Wrap `model` with fresh LoRA adapters (peft modifies the base in place)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    pcfg = PeftLoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, pcfg)
    except ValueError as exc:  # peft: none of the target modules is in the model
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ModelError(f"lora.target_modules: {list(cfg.target_modules)} matches no module of the model "
                         f"({str(exc).splitlines()[0][:160]}); its linear layers: {', '.join(linear)}") from None


def load_with_adapter(base_dir: str | Path, adapter_dir: str | Path, mcfg: ModelConfig) -> torch.nn.Module:
    """Base model plus a saved LoRA adapter (safetensors), adapter weights trainable."""
    from peft import PeftModel

    base = load_model(base_dir, mcfg)
    return PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True, local_files_only=True)


def build_model(cfg: PipelineConfig, device: torch.device) -> tuple[Any, Any]:
    """(model, tokenizer) as a training run starts them: base weights (seeded by
    train.seed), activation checkpointing, LoRA when train.finetune is lora."""
    base = base_model_dir(cfg)
    tokenizer = load_tokenizer(base, cfg.model)
    torch.manual_seed(cfg.train.seed)
    model = load_model(base, cfg.model)
    if cfg.train.activation_checkpointing:  # non-reentrant: works with frozen (LoRA) inputs
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.train.finetune == "lora":
        model = add_lora(model, cfg.lora)
    return model.to(device), tokenizer


def save_trained(model: Any, tokenizer: Any, out_dir: Path) -> None:
    """Save a plain HF folder (LoRA merged in) with safetensors weights, atomically."""
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    ensure_dir(tmp)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)


def plain_model(cfg: PipelineConfig, model: Any, info: Any) -> Any:
    """The trained model as one plain module on rank 0 (FSDP shards gathered; collective)."""
    if not parallel.is_sharded(model):
        return parallel.unwrap(model)
    weights = parallel.full_state_dict(model)
    if not info.is_main:
        return None
    trained = build_model(cfg, torch.device("cpu"))[0]
    trained.load_state_dict(weights)
    return trained
