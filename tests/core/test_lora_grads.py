"""Per-sample LoRA gradients, Adam preconditioning and the blockwise random projection."""

import pytest
import torch

from clusterft.core.lora_grads import (
    AdamMoments,
    PerSampleLoraGrads,
    loop_per_sample_grads,
    lora_parameters,
)
from clusterft.core.tokens import collate
from clusterft.errors import LoraGradError
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


def test_response_only_head_gives_the_full_logit_gradients():
    model = lora_model()
    batch = collate(lora_samples(), pad_id=0)
    fast_grads = PerSampleLoraGrads(model)(batch)
    full_grads = PerSampleLoraGrads(model, response_only_head=False)(batch)
    assert ((fast_grads - full_grads).norm(dim=1) / full_grads.norm(dim=1)).max() < 1e-5
