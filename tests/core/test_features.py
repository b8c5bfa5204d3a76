import numpy as np
import pytest
import torch

from clusterft.core.features import build_extractor
from clusterft.core.tokens import collate
from clusterft.runtime.features import extract
from clusterft.runtime.model import build_tiny_model, train_tokenizer
from clusterft.spec.config import TinyModelConfig, load_config
from tests.helpers.grad_case import case_samples
from tests.helpers.lora_case import lora_model, lora_samples


@pytest.mark.parametrize("kind", ["lora_grad", "lastlayer"])
def test_bf16_features_follow_the_fp32_ones(kind, tmp_path):
    """train.precision reaches the features: a bf16 pass gives (almost) the fp32 directions."""
    model = lora_model()
    fcfg = load_config(None, [f"features.kind={kind}", "features.model=target", "features.dim=64",
                              "features.precondition=false"]).features
    ext = build_extractor(model, fcfg)
    fp32 = extract(ext, lora_samples(), 0, 4)
    bf16 = extract(ext, lora_samples(), 0, 4, precision="bf16")
    assert not np.array_equal(fp32, bf16)  # autocast did run
    cos = (fp32 * bf16).sum(1) / np.linalg.norm(fp32, axis=1) / np.linalg.norm(bf16, axis=1)
    assert cos.min() > 0.98


def test_lastlayer_feature_is_mean_of_logit_grad_times_hidden():
    tok = train_tokenizer(["a b c d e f g h i j k l m n o p q r s t u v w x y z"] * 10, 300)
    model = build_tiny_model(TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2,
                                             intermediate_size=32), tok, 32)
    samples = case_samples()
    ext = build_extractor(model, load_config(None, ["features.kind=lastlayer", "features.model=target"]).features)
    got = extract(ext, samples, 0, 3)
    assert got.shape == (4, 16)
    for i, s in enumerate(samples):  # one at a time, no padding, by autograd on the logits
        b = collate([s], 0)
        out = model(input_ids=b["input_ids"], output_hidden_states=True)
        h = out.hidden_states[-1][0, :-1]
        labels = b["labels"][0, 1:]
        keep = labels != -100
        logits = out.logits[0, :-1].detach().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="sum")
        (g,) = torch.autograd.grad(loss, logits)
        true_logit_grad = g.gather(1, labels.clamp(min=0)[:, None])[:, 0]  # = p_y - 1
        want = (true_logit_grad[keep, None] * h[keep]).mean(0).detach().numpy()
        np.testing.assert_allclose(got[i], want, rtol=1e-4, atol=1e-6)


def test_embedding_is_mean_hidden_state_over_non_pad_tokens():
    from clusterft.core.features import embedding_batch

    tok = train_tokenizer(["a b c d e f g h i j k l m n o p q r s t u v w x y z"] * 10, 300)
    model = build_tiny_model(TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2,
                                             intermediate_size=32), tok, 32)
    samples = case_samples()
    got = embedding_batch(model, collate(samples, 0))
    for i, s in enumerate(samples):
        h = model(input_ids=collate([s], 0)["input_ids"], output_hidden_states=True).hidden_states[-1]
        torch.testing.assert_close(got[i], h[0].mean(0), rtol=1e-4, atol=1e-5)
