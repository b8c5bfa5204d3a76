"""Held-out losses: length-grouped batches at answer positions give each sample's own loss."""

import torch

from clusterft.core.losses import per_sample_loss
from clusterft.core.tokens import Example, collate, encode
from clusterft.runtime.generation import sample_losses


def test_sample_losses_equal_one_sample_at_a_time_in_input_order(tiny_model_dir):
    from transformers import AutoTokenizer

    from clusterft.runtime.model import load_model

    model, tok = load_model(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    words = "a b c d e f g h i j k l".split()
    examples = [Example(id=str(n), prompt=f"copy {' '.join(words[:n])}\n", response=" ".join(words[: 13 - n]))
                for n in (9, 1, 5, 12, 3, 7, 2)]  # lengths out of order, so grouping reorders them
    got = sample_losses(model, tok, examples, max_length=64, batch_size=3)
    for ex, g in zip(examples, got):
        one = collate([encode(ex, tok, 64)], tok.pad_token_id)
        with torch.no_grad():
            want = per_sample_loss(model(input_ids=one["input_ids"]).logits, one["labels"])[0].item()
        assert abs(g - want) < 1e-4 * max(1.0, abs(want))
    assert len(set(round(g, 6) for g in got)) == len(got)  # distinct losses: a mix-up would show
