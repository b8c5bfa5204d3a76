"""A tiny Llama with a LoRA adapter whose B factors are non-zero (fresh LoRA has B = 0,
which would make every lora_A gradient zero), plus samples of different lengths."""

import torch

from clusterft.core.tokens import IGNORE_INDEX, Encoded
from clusterft.runtime.model import add_lora, build_tiny_model, train_tokenizer
from clusterft.spec.config import LoraConfig, TinyModelConfig


def lora_model(seed: int = 0, dropout: float = 0.0) -> torch.nn.Module:
    tok = train_tokenizer(["a b c d e f g h i j k l m n o p q r s t u v w x y z"] * 10, 300)
    model = build_tiny_model(TinyModelConfig(hidden_size=16, num_layers=2, num_heads=2,
                                             intermediate_size=32, seed=seed), tok, 32)
    model = add_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"], dropout=dropout))
    torch.manual_seed(seed)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    return model.eval()


def lora_samples() -> list[Encoded]:
    """Five samples, 3 to 11 tokens, prompts of 1 to 4 tokens (pads differ within a batch)."""
    seqs = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23],
            [19, 20, 21, 22], [30, 31, 32, 33, 34, 35, 36]]
    prompt = [2, 1, 4, 2, 3]
    return [Encoded(id=str(i), input_ids=s, labels=[IGNORE_INDEX] * k + s[k:])
            for i, (s, k) in enumerate(zip(seqs, prompt))]
