"""Per-sample losses count only the answer tokens, from full logits or answer positions only."""

import torch

from clusterft.core.losses import ResponseLoss, per_sample_loss
from clusterft.core.tokens import IGNORE_INDEX, Encoded, collate, encode, shared_prefix
from clusterft.io.examples import load_jsonl
from tests.helpers.data_case import T, write
from tests.helpers.lora_case import lora_model, lora_samples


def test_per_sample_loss_ignores_prompt_and_padding(tokenizer, tmp_path):
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


def test_response_only_head_is_used_and_equals_full_logits():
    model = lora_model()
    batch = collate(lora_samples(), pad_id=0)
    fast = ResponseLoss(model)
    got = fast(model, batch)
    assert fast.response_only  # the tiny Llama exposes decoder + plain Linear head
    torch.testing.assert_close(got, ResponseLoss(model, response_only=False)(model, batch))


def test_response_only_head_falls_back_when_the_model_changes_its_logits():
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


def _system_prompted() -> list[Encoded]:
    """lora_samples behind a shared 4-token system prompt."""
    system = [1, 2, 3, 4]
    return [Encoded(id=e.id, input_ids=system + e.input_ids, labels=[IGNORE_INDEX] * 4 + e.labels)
            for e in lora_samples()]


def test_a_shared_prompt_cached_once_gives_the_losses_and_top_tokens_of_the_rows_run_whole():
    model, rows = lora_model(), _system_prompted()
    assert shared_prefix(rows) == [1, 2, 3, 4]
    batch = collate(rows, pad_id=0)
    whole = ResponseLoss(model).with_top(model, batch)
    loss = ResponseLoss(model)
    with torch.no_grad():
        got = loss.with_top(model, batch, loss.prefix(rows[0].input_ids[:4]))
    assert loss.prefix_ok
    torch.testing.assert_close(got[0], whole[0])
    assert torch.equal(got[1], whole[1])


def test_a_cache_of_another_prompt_is_caught_and_every_row_runs_whole(caplog):
    model, rows = lora_model(), _system_prompted()
    batch = collate(rows, pad_id=0)
    whole = ResponseLoss(model).with_top(model, batch)
    loss = ResponseLoss(model)
    with torch.no_grad():
        got = loss.with_top(model, batch, loss.prefix([9, 9, 9, 9]))  # not what the rows start with
    assert loss.prefix_ok is False and "disagrees" in caplog.text
    torch.testing.assert_close(got[0], whole[0])
