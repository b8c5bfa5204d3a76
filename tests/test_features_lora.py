"""Per-sample LoRA gradients, Adam preconditioning and the blockwise random projection."""

import numpy as np
import pytest
import torch

from clusterft.data import collate
from clusterft.lora_grads import (AdamMoments, LoraGradError, PerSampleLoraGrads,
                                  load_adam_moments, loop_per_sample_grads, lora_parameters)
from clusterft.projection import BLOCK_ROWS, RandomProjection, projection_block, projection_matrix
from tests.helpers.lora_case import lora_model, lora_samples


def test_batched_per_sample_grads_equal_a_batch_size_one_loop():
    model = lora_model()
    samples = lora_samples()
    batch = collate(samples, pad_id=0)  # lengths 3..11: every row but one is padded
    got = PerSampleLoraGrads(model)(batch)
    params = [p for _, p in lora_parameters(model)]
    assert got.shape == (len(samples), sum(p.numel() for p in params))
    for i, s in enumerate(samples):  # plain autograd, one unpadded sample at a time
        one = collate([s], pad_id=0)
        loss = torch.nn.functional.cross_entropy(
            model(input_ids=one["input_ids"]).logits[0, :-1], one["labels"][0, 1:], ignore_index=-100)
        want = torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)])
        assert want.norm() > 0
        assert (got[i] - want).norm() / want.norm() < 1e-5
    loop = loop_per_sample_grads(model, batch)
    assert ((got - loop).norm(dim=1) / loop.norm(dim=1)).max() < 1e-5


def test_per_sample_grads_reject_non_lora_trainable_parameters():
    model = lora_model()
    next(p for n, p in model.named_parameters() if "embed_tokens" in n).requires_grad_(True)
    with pytest.raises(LoraGradError, match="embed_tokens"):
        PerSampleLoraGrads(model)


def test_adam_preconditioning_matches_less_formula():
    m, v = torch.tensor([0.1, -0.2, 0.0]), torch.tensor([0.04, 0.01, 0.0])
    g = torch.tensor([[1.0, 2.0, -3.0]])
    got = AdamMoments(m, v, beta1=0.9, beta2=0.999, eps=1e-8).precondition(g)
    m2 = 0.9 * m + 0.1 * g
    v2 = 0.999 * v + 0.001 * g**2
    torch.testing.assert_close(got, m2 / (v2.sqrt() + 1e-8))
    assert got[0, 2] == pytest.approx(-0.3 / 0.009**0.5, rel=1e-5)


def test_moments_saved_by_warmup_load_in_gradient_order(tmp_path):
    from clusterft.warmup import save_adam_moments

    model = lora_model()
    named = lora_parameters(model)
    opt = torch.optim.AdamW([p for _, p in named], betas=(0.8, 0.95), eps=1e-6)
    batch = collate(lora_samples(), 0)
    model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
          labels=batch["labels"]).loss.backward()
    opt.step()
    save_adam_moments(opt, named, tmp_path / "m.safetensors")
    mom = load_adam_moments(tmp_path / "m.safetensors", PerSampleLoraGrads(model).names)
    want = torch.cat([opt.state[p]["exp_avg"].flatten() for _, p in named])
    torch.testing.assert_close(mom.exp_avg, want)
    assert (mom.beta1, mom.beta2, mom.eps) == (0.8, 0.95, 1e-6)
    with pytest.raises(LoraGradError, match="no Adam moments"):
        load_adam_moments(tmp_path / "absent.safetensors", ["x"])


@pytest.mark.parametrize("kind", ["rademacher", "gaussian"])
def test_projection_is_seeded_and_blockwise_equals_cached(kind):
    n_in, dim = 2 * BLOCK_ROWS + 300, 64  # a short last block
    x = torch.randn(5, n_in)
    cached = RandomProjection(n_in, dim, kind, seed=3)
    blockwise = RandomProjection(n_in, dim, kind, seed=3, cache_mb=0)
    assert cached.cached and not blockwise.cached
    full = torch.from_numpy(projection_matrix(kind, 3, n_in, dim))
    torch.testing.assert_close(cached(x), x @ full)
    torch.testing.assert_close(blockwise(x), x @ full, rtol=1e-5, atol=1e-5)
    again = projection_matrix(kind, 3, n_in, dim)
    np.testing.assert_array_equal(again, full.numpy())
    assert not np.array_equal(projection_matrix(kind, 4, n_in, dim), again)
    np.testing.assert_array_equal(again[BLOCK_ROWS : 2 * BLOCK_ROWS],
                                  projection_block(kind, 3, 1, BLOCK_ROWS, dim))


def test_rademacher_entries_and_norms():
    r = projection_block("rademacher", 0, 0, 512, 256)
    assert set(np.unique(r)) == {np.float32(-1 / 16), np.float32(1 / 16)}
    assert abs((r > 0).mean() - 0.5) < 0.01
    x = torch.randn(20, 4000)
    y = RandomProjection(4000, 2048, "rademacher", seed=1)(x)
    ratio = y.norm(dim=1) / x.norm(dim=1)
    assert ((ratio > 0.9) & (ratio < 1.1)).all()  # JL: norms kept up to a few percent


def test_response_only_head_is_used_and_equals_full_logits():
    from clusterft.lora_grads import ResponseLoss

    model = lora_model()
    batch = collate(lora_samples(), pad_id=0)
    fast = ResponseLoss(model)
    got = fast(model, batch)
    assert fast.response_only  # the tiny Llama exposes decoder + plain Linear head
    torch.testing.assert_close(got, ResponseLoss(model, response_only=False)(model, batch))
    fast_grads = PerSampleLoraGrads(model)(batch)
    full_grads = PerSampleLoraGrads(model, response_only_head=False)(batch)
    assert ((fast_grads - full_grads).norm(dim=1) / full_grads.norm(dim=1)).max() < 1e-5


def test_response_only_head_falls_back_when_the_model_changes_its_logits():
    from clusterft.lora_grads import ResponseLoss

    model = lora_model()
    batch = collate(lora_samples(), pad_id=0)
    causal_lm = model.get_base_model()  # e.g. logit soft-capping after the head
    handle = causal_lm.register_forward_hook(
        lambda mod, inp, out: out.__setitem__("logits", out["logits"] * 0.5) or out)
    try:
        loss = ResponseLoss(model)
        got = loss(model, batch)
        assert not loss.response_only
        torch.testing.assert_close(got, ResponseLoss(model, response_only=False)(model, batch))
    finally:
        handle.remove()


def test_sparse_projection_is_seeded_sparse_and_keeps_norms():
    from clusterft.projection import sparse_s

    n_in, dim = 2 * BLOCK_ROWS + 300, 512
    proj = RandomProjection(n_in, dim, "sparse", seed=3, cache_mb=0)  # always cached: it is small
    dense = projection_matrix("sparse", 3, n_in, dim)
    s = sparse_s(n_in)
    assert proj.cached and proj.sparse_t._nnz() == np.count_nonzero(dense)
    assert abs(np.count_nonzero(dense) / dense.size - 1 / s) < 0.1 / s
    np.testing.assert_allclose(np.unique(np.abs(dense[dense != 0])), np.sqrt(s / dim), rtol=1e-6)
    np.testing.assert_array_equal(projection_matrix("sparse", 3, n_in, dim), dense)
    assert not np.array_equal(projection_matrix("sparse", 4, n_in, dim), dense)
    x = torch.randn(6, n_in)
    torch.testing.assert_close(proj(x), x @ torch.from_numpy(dense), rtol=1e-4, atol=1e-4)
    x = torch.randn(20, 40_000)
    ratio = RandomProjection(40_000, 4096, "sparse", seed=1)(x).norm(dim=1) / x.norm(dim=1)
    assert ((ratio > 0.9) & (ratio < 1.1)).all()


@pytest.mark.parametrize("kind", ["lora_grad", "lastlayer"])
def test_bf16_features_follow_the_fp32_ones(kind, tmp_path):
    """train.precision reaches the features: a bf16 pass gives (almost) the fp32 directions."""
    from clusterft.config import load_config
    from clusterft.features import build_extractor, extract

    model = lora_model()
    fcfg = load_config(None, [f"features.kind={kind}", "features.model=target", "features.dim=64",
                              "features.precondition=false"]).features
    ext = build_extractor(model, fcfg, tmp_path / "no-adapter")
    fp32 = extract(ext, lora_samples(), 0, 4)
    bf16 = extract(ext, lora_samples(), 0, 4, precision="bf16")
    assert not np.array_equal(fp32, bf16)  # autocast did run
    cos = (fp32 * bf16).sum(1) / np.linalg.norm(fp32, axis=1) / np.linalg.norm(bf16, axis=1)
    assert cos.min() > 0.98
