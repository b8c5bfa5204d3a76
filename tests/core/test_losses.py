"""Per-sample losses count only the answer tokens, from full logits or answer positions only."""

import torch

from clusterft.core.losses import ResponseLoss, TrainLoss, per_sample_loss, weighted_loss
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


def test_response_only_head_falls_back_when_the_decoder_cannot_take_its_call():
    model = lora_model()
    batch = collate(lora_samples(), pad_id=0)
    loss = ResponseLoss(model)

    def refuses(**kw):  # e.g. a custom decoder without attention_mask=None or cache=
        raise TypeError("unexpected keyword argument")

    loss.parts = (refuses, loss.parts[1])
    got = loss(model, batch)
    assert not loss.response_only
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


def _grads(model, fn) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    loss, losses = fn()
    loss.backward()
    return losses, {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_train_loss_gives_the_loss_and_gradients_of_full_logits_with_the_prompt_run_once():
    model, rows = lora_model(), _system_prompted()
    batch, w = collate(rows, pad_id=0), torch.tensor([0.5, 2.0, 1.0, 0.5, 1.5])
    fast = TrainLoss(model, model, shared_prefix(rows))
    fast.check(batch)
    assert fast.ok and fast.prefix_ok and fast._cut(batch) == 4  # the 4-token system prompt: one row's run
    want, want_g = _grads(model, lambda: weighted_loss(model, batch, w, 0.7))
    got, got_g = _grads(model, lambda: fast(batch, w, 0.7))
    torch.testing.assert_close(got, want)
    assert want_g and all(float(g.abs().sum()) > 0 for g in want_g.values())
    for n in want_g:  # the prompt's keys and values carry gradient back into the adapter
        torch.testing.assert_close(got_g[n], want_g[n], rtol=1e-4, atol=1e-6, msg=n)


def test_train_loss_runs_rows_whole_when_one_lacks_the_prompt_or_answers_inside_it():
    model, rows = lora_model(), _system_prompted()
    fast = TrainLoss(model, model, [1, 2, 3, 4])
    other = [*rows[:4], Encoded(id="x", input_ids=[1, 2, 9, 4, 5, 6], labels=[IGNORE_INDEX] * 4 + [5, 6])]
    early = [*rows[:4], Encoded(id="y", input_ids=[1, 2, 3, 4, 5, 6], labels=[IGNORE_INDEX] * 4 + [5, 6])]
    w = torch.ones(5)
    for batch in (collate(other, 0), collate(early, 0)):
        fast.check(batch)
        assert fast.ok and fast.prefix_ok is None and fast._cut(batch) == 0  # the prefix: not checked yet
        torch.testing.assert_close(fast(batch, w, 1.0)[1], weighted_loss(model, batch, w, 1.0)[1])


def test_the_shared_prefix_is_checked_on_the_first_batch_that_has_it_and_dropped_when_it_is_ignored(caplog):
    model, rows = lora_model(), _system_prompted()
    fast = TrainLoss(model, model, [1, 2, 3, 4])
    lacking = collate([*rows[:4], Encoded(id="x", input_ids=[1, 2, 9, 4, 5, 6], labels=[IGNORE_INDEX] * 4 + [5, 6])], 0)
    batch, w = collate(rows, pad_id=0), torch.ones(5)
    handle = model.get_base_model().register_forward_pre_hook(  # a model that drops the cache it is given
        lambda mod, args, kw: (args, {k: v for k, v in kw.items() if k != "cache"}), with_kwargs=True)
    try:
        fast.check(lacking)
        assert fast.ok and fast.prefix_ok is None
        fast.check(batch)
        assert fast.ok and fast.prefix_ok is False and "shared prefix disagrees" in caplog.text
        torch.testing.assert_close(fast(batch, w, 1.0)[1], weighted_loss(model, batch, w, 1.0)[1])
    finally:
        handle.remove()


def test_train_loss_is_checked_without_dropout_so_a_dropout_adapter_keeps_the_fast_loss():
    model, rows = lora_model(dropout=0.5).train(), _system_prompted()
    fast = TrainLoss(model, model, shared_prefix(rows))
    fast.check(collate(rows, pad_id=0))
    assert fast.ok and fast.prefix_ok and model.training


def test_train_loss_falls_back_to_full_logits_when_the_model_ignores_logits_to_keep(caplog):
    model, rows = lora_model(), _system_prompted()
    batch, w = collate(rows, pad_id=0), torch.ones(5)
    handle = model.get_base_model().register_forward_pre_hook(  # an older model class: logits everywhere
        lambda mod, args, kw: (args, {k: v for k, v in kw.items() if k != "logits_to_keep"}), with_kwargs=True)
    try:
        fast = TrainLoss(model, model, shared_prefix(rows))
        fast.check(batch)
        assert fast.ok is False and "unusable" in caplog.text
        torch.testing.assert_close(fast(batch, w, 1.0)[1], weighted_loss(model, batch, w, 1.0)[1])
    finally:
        handle.remove()
