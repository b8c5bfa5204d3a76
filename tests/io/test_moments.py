"""The warmup's Adam moments round-trip in the gradients' order."""

import pytest
import torch

from clusterft.core.lora_grads import (
    PerSampleLoraGrads,
    lora_parameters,
)
from clusterft.core.tokens import collate
from clusterft.errors import LoraGradError
from clusterft.io.moments import load_adam_moments
from tests.helpers.lora_case import lora_model, lora_samples


def test_moments_saved_by_warmup_load_in_gradient_order(tmp_path):
    from clusterft.io.moments import save_adam_moments

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
