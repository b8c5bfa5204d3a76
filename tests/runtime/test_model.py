
import pytest
import torch

from clusterft.errors import ModelError
from clusterft.runtime.model import (
    add_lora,
    load_model,
    load_tokenizer,
    prepare_builtin,
)
from clusterft.spec.config import LoraConfig, ModelConfig, load_config


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("m") / "base"
    cfg = load_config(None, ["model.tiny.hidden_size=32", "model.tiny.num_layers=2",
                             "model.tiny.num_heads=2", "model.tiny.intermediate_size=64",
                             "model.tiny.vocab_size=300"])
    info = prepare_builtin(cfg, ["Instruction: copy\nInput: a b\nResponse: a b"] * 50, out)
    return out, info


def test_builtin_model_saves_safetensors_and_reloads_identically(built):
    out, info = built
    assert list(out.glob("*.safetensors")) and not list(out.glob("*.bin"))
    model = load_model(out)
    tok = load_tokenizer(out)
    assert model.config.vocab_size == len(tok) == info["vocab_size"]  # trained vocab may be < asked
    again = load_model(out)
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), n


def test_lora_trains_only_adapters(built):
    model = add_lora(load_model(built[0]), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_folder_without_weights_is_a_clear_error(tmp_path, built):
    (tmp_path / "config.json").write_text((built[0] / "config.json").read_text())
    with pytest.raises(ModelError, match="no \\*.safetensors weights"):
        load_model(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ModelError, match="only pickle-based"):
        load_model(tmp_path)
    with pytest.raises(ModelError, match="model folder not found"):
        load_model(tmp_path / "missing")


def test_remote_code_is_off_by_default(built, monkeypatch):
    seen = {}
    import transformers

    real = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*a, **k):
        seen.update(k)
        return real(*a, **k)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    load_model(built[0], ModelConfig())
    assert seen["trust_remote_code"] is False and seen["use_safetensors"] is True
