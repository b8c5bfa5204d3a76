"""The `features` stage: default kind, shards, resume after a crash, and torchrun workers
(lora_grad, the kind whose shards cost the most)."""

import numpy as np
import pytest

from clusterft.errors import ConfigError
from clusterft.io import artifacts
from clusterft.io.shards import shard_complete
from clusterft.spec.config import load_config
from clusterft.stages import features as features_stage
from clusterft.stages.features import run_features
from tests.conftest import tiny_params, write_params


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Tiny benchmark, model and warmup adapter (with Adam moments); 240 samples."""
    from clusterft.orchestration.launch import stage_functions

    root = tmp_path_factory.mktemp("features_stage")
    p = tiny_params(root)
    p["features"]["model"] = "target"  # lora_grad: gradients of the model being trained
    params = write_params(root, p)
    cfg = load_config(params)
    fns = stage_functions()
    for name in ("make-benchmark", "prepare-model", "warmup"):
        fns[name](cfg)
    return params


def cfg_with(params, *overrides):
    return load_config(params, ["features.kind=lora_grad", "features.shard_size=64", "features.batch_size=32",
                                *overrides])


def test_default_kind_is_embedding_and_bad_projection_is_rejected():
    cfg = load_config(None)  # embedding clustered best per second (BENCHMARKS.md)
    assert (cfg.features.kind, cfg.features.dim, cfg.features.precondition) == ("embedding", 8192, True)
    with pytest.raises(ConfigError, match="features.projection"):
        load_config(None, ["features.projection=orthogonal"])


def test_shard_with_wrong_shape_is_not_complete(tmp_path):
    artifacts.save_npy(tmp_path / "s.npy", np.zeros((3, 4), np.float32))
    assert shard_complete(tmp_path / "s.npy", (0, 3), 4)
    assert not shard_complete(tmp_path / "s.npy", (0, 5), 4)
    (tmp_path / "t.npy").write_bytes(b"\x93NUMPY truncated")
    assert not shard_complete(tmp_path / "t.npy", (0, 3), 4)


class Killed(Exception):
    """Stands for the process being killed mid-run."""


def spy_save(monkeypatch, fail_after=None):
    """Record shard paths written through save_npy; raise as a kill would after `fail_after`."""
    real_save, written = artifacts.save_npy, []

    def save(path, array):
        if fail_after is not None and len(written) == fail_after:
            raise Killed()
        real_save(path, array)
        written.append(path)

    monkeypatch.setattr(features_stage, "save_npy", save)  # the name the stage writes its shards with
    return written


def test_crash_then_rerun_recomputes_only_missing_shards(prepared, monkeypatch):
    cfg = cfg_with(prepared)
    m = run_features(cfg)
    assert (m["kind"], m["n"], m["dim"], m["n_shards"], m["shards_computed"]) == ("lora_grad", 240, 8192, 4, 4)
    want = artifacts.load_npy(cfg.artifact("features", "features.npy"))
    assert not cfg.artifact("features", "shards").exists()  # merged, then removed

    cfg.artifact("features", "features.npy").unlink()
    before_crash = spy_save(monkeypatch, fail_after=2)
    with pytest.raises(Killed):
        run_features(cfg)
    monkeypatch.undo()
    after_crash = spy_save(monkeypatch)
    m = run_features(cfg)
    assert (m["shards_computed"], m["shards_reused"], m["samples_computed"]) == (2, 2, 112)
    assert len(after_crash) == 2 and not set(after_crash) & set(before_crash)
    np.testing.assert_array_equal(artifacts.load_npy(cfg.artifact("features", "features.npy")), want)


def test_shards_from_another_spec_are_discarded(prepared, monkeypatch):
    spy_save(monkeypatch, fail_after=2)
    with pytest.raises(Killed):
        run_features(cfg_with(prepared, "features.seed=1"))
    monkeypatch.undo()
    m = run_features(cfg_with(prepared))  # same shapes, other seed: the 2 shards are stale
    assert (m["shards_computed"], m["shards_reused"]) == (4, 0)


def test_raw_gradient_features_equal_autograd_per_sample(prepared):
    from clusterft.core.lora_grads import loop_per_sample_grads
    from clusterft.core.tokens import collate, encode_all
    from clusterft.io.moments import state_dir
    from clusterft.runtime.data import load_examples
    from clusterft.runtime.model import (
        base_model_dir,
        load_tokenizer,
        load_with_adapter,
    )

    cfg = cfg_with(prepared, "features.projection=none", "features.precondition=false")
    m = run_features(cfg)
    assert m["dim"] == m["n_lora_params"] == 2048
    feats = artifacts.load_npy(cfg.artifact("features", "features.npy"))
    tok = load_tokenizer(base_model_dir(cfg))
    encoded = encode_all(load_examples(cfg, "train")[:3], tok, cfg.data.max_length)
    model = load_with_adapter(base_model_dir(cfg), state_dir(cfg) / "adapter", cfg.model).eval()
    want = loop_per_sample_grads(model, collate(encoded, tok.pad_token_id)).numpy()
    np.testing.assert_allclose(feats[:3], want, rtol=1e-4, atol=1e-6)


def test_two_torchrun_workers_match_one_process(prepared):
    from clusterft.orchestration.launch import launch

    cfg = cfg_with(prepared, "features.kind=lastlayer")
    run_features(cfg)
    one = artifacts.load_npy(cfg.artifact("features", "features.npy"))
    launch(2, ["features", "--params", str(prepared), "--set", "features.shard_size=64",
               "--set", "features.batch_size=32", "--set", "features.kind=lastlayer"])
    m = artifacts.read_json(cfg.artifact("features", "metrics.json"))
    assert (m["world_size"], m["shards_computed"], m["n"]) == (2, 4, 240)
    np.testing.assert_allclose(artifacts.load_npy(cfg.artifact("features", "features.npy")), one,
                               rtol=1e-5, atol=1e-6)
