"""`features.model`: a from-scratch proxy, the target through its LoRA warmup, or a sentence
encoder folder; S2L loss trajectories; and the config checks that refuse what cannot fit."""

import json

import numpy as np
import pytest
import torch

from clusterft.errors import ConfigError
from clusterft.io import artifacts
from clusterft.io.preflight import load_checked
from clusterft.spec.config import load_config
from tests.conftest import tiny_params, write_params


def _run(cfg, *stages):
    from clusterft.orchestration.launch import stage_functions

    fns = stage_functions()
    return [fns[s](cfg) for s in stages]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("feature_models")
    cfg = load_config(write_params(root, tiny_params(root)))
    _run(cfg, "make-benchmark", "prepare-model")
    return root


def test_proxy_embedding_trains_its_own_model_and_tokenizer(root):
    cfg = load_config(root / "params.yaml", ["features.model=proxy", "features.kind=embedding"])
    warm, feats = _run(cfg, "warmup", "features")
    proxy = cfg.artifact("warmup", "state", "proxy")
    assert (proxy / "model.safetensors").exists() and (proxy / "tokenizer.json").exists()
    assert warm["features_model"] == "proxy" and warm["snapshots"] == []
    x = artifacts.load_npy(cfg.artifact("features", "features.npy"))
    assert x.shape == (240, cfg.model.tiny.hidden_size) and np.isfinite(x).all()
    assert feats["features_model"] == "proxy"
    manifest = json.loads(cfg.artifact("features", "manifest.json").read_text())
    assert manifest["data_digest"] == artifacts.file_digest(cfg.data.train)  # select refuses other data


def test_loss_trajectory_columns_are_the_snapshot_losses(root):
    from clusterft.core.losses import per_sample_loss
    from clusterft.core.tokens import Renderer, collate, encode_all
    from clusterft.runtime.data import load_examples
    from clusterft.runtime.model import load_model, load_tokenizer

    cfg = load_config(root / "params.yaml", ["features.model=proxy", "features.kind=loss_traj",
                                             "warmup.snapshots=3"])
    warm, feats = _run(cfg, "warmup", "features")
    snaps = sorted(cfg.artifact("warmup", "state", "snapshots").glob("step-*"))
    assert len(snaps) == 3 == len(warm["snapshots"]) and warm["snapshots"][-1] == warm["steps"]
    x = artifacts.load_npy(cfg.artifact("features", "features.npy"))
    assert x.shape == (240, 4) and feats["dim"] == 4
    norms = np.linalg.norm(x.astype(np.float64), axis=1)
    np.testing.assert_allclose(norms, norms.max(), rtol=1e-5)  # lifted: normalising keeps levels
    tok = load_tokenizer(cfg.artifact("warmup", "state", "proxy"))
    enc = encode_all(load_examples(cfg, "train", Renderer(cfg.data.prompt_template))[:4], tok,
                     cfg.data.max_length)
    batch = collate(enc, tok.pad_token_id)
    for j, snap in enumerate(snaps):
        with torch.no_grad():
            want = per_sample_loss(load_model(snap)(input_ids=batch["input_ids"],
                                                    attention_mask=batch["attention_mask"]).logits,
                                   batch["labels"]).numpy()
        np.testing.assert_allclose(x[:4, j], want, rtol=1e-4, atol=1e-5)
    assert (x[:, 0] > x[:, -2]).mean() > 0.5  # the proxy learns: later losses are mostly lower


def test_encoder_folder_gives_mean_pooled_embeddings_without_warmup(root, tmp_path):
    from transformers import BertConfig, BertModel

    from clusterft.runtime.model import train_tokenizer

    enc_dir = tmp_path / "encoder"
    tok = train_tokenizer(["a b c d e f g h i j Instruction Response Input"] * 10, 300)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=128)).save_pretrained(enc_dir)
    tok.save_pretrained(enc_dir)
    cfg = load_config(root / "params.yaml", [f"features.model={enc_dir}", "features.kind=embedding"])
    warm, feats = _run(cfg, "warmup", "features")
    assert warm["steps"] == 0 and warm["wall_clock_s"] < 5
    x = artifacts.load_npy(cfg.artifact("features", "features.npy"))
    assert x.shape == (240, 24) and np.isfinite(x).all() and np.unique(x, axis=0).shape[0] > 50


@pytest.mark.parametrize("overrides, key", [
    (["features.model=/nope/encoder"], "features.model"),
    (["features.model=proxy", "features.kind=lora_grad"], "features.kind"),
    (["features.model=target", "features.kind=lora_grad"], None),
    (["data.chat_template=true"], "data.chat_template"),
    (["evaluate.split=train"], "evaluate.split"),
    (["warmup.snapshots=0"], "warmup.snapshots"),
])
def test_feature_model_and_kind_are_checked_at_load(overrides, key):
    """Values at load_config; a folder that is not there at the preflight every entry point runs."""
    if key is None:
        load_checked(None, overrides)
        return
    with pytest.raises(ConfigError, match=key):
        load_checked(None, overrides)


def test_encoder_folder_must_be_a_model_and_fit_the_kind(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="features.model: .*safetensors"):
        load_checked(None, [f"features.model={tmp_path}"])
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match="features.kind: an encoder folder"):
        load_config(None, [f"features.model={tmp_path}", "features.kind=loss_traj"])


def test_chat_template_needs_a_tokenizer_that_has_one(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "x"}))
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")  # checked for at load; read by the stages
    with pytest.raises(ConfigError, match="data.chat_template: .*no chat template"):
        load_checked(None, ["data.chat_template=true", f"model.path={tmp_path}"])
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    load_config(None, ["data.chat_template=true", f"model.path={tmp_path}"])
