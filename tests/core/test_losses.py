"""Per-sample losses count only the answer tokens."""



from clusterft.core.losses import per_sample_loss
from clusterft.core.tokens import IGNORE_INDEX, collate, encode
from clusterft.io.examples import load_jsonl
from tests.helpers.data_case import T, write


def test_per_sample_loss_ignores_prompt_and_padding(tokenizer, tmp_path):
    import torch

    exs = load_jsonl(write(tmp_path, [{"instruction": "copy", "input": "a", "output": "a"},
                                      {"instruction": "copy", "input": "a b c", "output": "a b c"}]), T)
    batch = collate([encode(e, tokenizer, 64) for e in exs], tokenizer.pad_token_id)
    torch.manual_seed(0)
    logits = torch.randn(*batch["input_ids"].shape, len(tokenizer))
    got = per_sample_loss(logits, batch["labels"])
    for i in range(2):
        lab = batch["labels"][i, 1:]
        keep = lab != IGNORE_INDEX
        want = torch.nn.functional.cross_entropy(logits[i, :-1][keep], lab[keep])
        assert torch.allclose(got[i], want, atol=1e-6)
