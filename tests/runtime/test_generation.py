"""Held-out losses: length-grouped batches at answer positions give each sample's own loss;
greedy answers read off the teacher-forced pass are the answers generation writes."""

import itertools
import random

import pytest
import torch

from clusterft.core.losses import ResponseLoss, per_sample_loss
from clusterft.core.scoring import exact_match
from clusterft.core.tokens import Example, collate, encode, encode_all
from clusterft.runtime.generation import SPOT_CHECK, generate_answers, greedy_answers, sample_losses


def test_sample_losses_equal_one_sample_at_a_time_in_input_order(tiny_model_dir):
    from transformers import AutoTokenizer

    from clusterft.runtime.model import load_model

    model, tok = load_model(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    words = "a b c d e f g h i j k l".split()
    examples = [Example(id=str(n), prompt=f"answer in words\ncopy {' '.join(words[:n])}\n",
                        response=" ".join(words[: 13 - n]))
                for n in (9, 1, 5, 12, 3, 7, 2)]  # lengths out of order, so grouping reorders them
    loss = ResponseLoss(model)
    got = sample_losses(model, tok, examples, max_length=64, batch_size=3, loss=loss)
    assert loss.prefix_ok  # the shared first line was run once, from a cache
    for ex, g in zip(examples, got):
        one = collate([encode(ex, tok, 64)], tok.pad_token_id)
        with torch.no_grad():
            want = per_sample_loss(model(input_ids=one["input_ids"]).logits, one["labels"])[0].item()
        assert abs(g - want) < 1e-4 * max(1.0, abs(want))
    assert len(set(round(g, 6) for g in got)) == len(got)  # distinct losses: a mix-up would show


LETTERS = "a b c d e f g h".split()


def _copy_example(rng, i: int, wrong: str = "") -> Example:
    """A prompt to copy 1-2 letters; its reference is wrong by a "z" at the "end" or the "start"."""
    words = " ".join(rng.sample(LETTERS, rng.randint(1, 2)))
    response = {"": words, "end": words + " z", "start": "z " + words}[wrong]
    return Example(id=str(i), prompt=f"copy {words}\n", response=response)


@pytest.fixture(scope="module")
def copier():
    """A 2-layer model trained for a few seconds on every prompt copying 1-2 letters, so it is right
    on every held-out prompt whose reference is right (a random training set left some out)."""
    from clusterft.runtime.model import build_tiny_model, train_tokenizer
    from clusterft.spec.config import TinyModelConfig

    tok = train_tokenizer([f"copy {' '.join(LETTERS)}\n" + " ".join(LETTERS + ["z"])] * 20, 300)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                                             seed=0), tok, 32)
    rng = random.Random(0)
    words = [(w,) for w in LETTERS] + list(itertools.permutations(LETTERS, 2))
    train = [Example(id=str(i), prompt=f"copy {' '.join(w)}\n", response=" ".join(w)) for i, w in enumerate(words)]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(600):
        b = collate(encode_all(rng.sample(train, 16), tok, 32), tok.pad_token_id)
        loss = per_sample_loss(model(input_ids=b["input_ids"]).logits, b["labels"]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    # a third of the reference answers are ones the model never writes, wrong at their end (where the
    # model writes EOS) or from their first token, so every path is taken
    evals = [_copy_example(rng, 100 + i, wrong={0: "end", 3: "start"}.get(i % 6, "")) for i in range(40)]
    evals.append(Example(id="open", prompt="copy a\n", response="a b", scored=False))  # held-out loss only
    return model.eval(), tok, evals


def _generated_all(model, tok, evals):
    return generate_answers(model, tok, [x.prompt for x in evals if x.scored], 8, 8, progress=False)


def test_greedy_answers_read_off_the_teacher_forced_pass_equal_generating_every_answer(copier):
    model, tok, evals = copier
    got = greedy_answers(model, tok, evals, max_length=32, batch_size=8, max_new_tokens=8, progress=False)
    want = _generated_all(model, tok, evals)
    scored = [x for x in evals if x.scored]
    assert want == [x.response.removeprefix("z ").removesuffix(" z") for x in scored]  # the copier is right
    assert got.answers == want
    # an answer the top tokens end with an EOS (right, or wrong at its end) is read off, SPOT_CHECK of them
    # also generated; one wrong from its first token is generated
    assert got.generated == sum(x.response.startswith("z ") for x in scored) + SPOT_CHECK and got.cut == 0
    assert got.losses == pytest.approx(sample_losses(model, tok, evals, 32, 8))


def test_greedy_answers_for_scoring_only_keep_the_start_of_an_answer_wrong_from_its_first_token(copier):
    model, tok, evals = copier
    got = greedy_answers(model, tok, evals, max_length=32, batch_size=8, max_new_tokens=8, progress=False,
                         complete=False)
    want = _generated_all(model, tok, evals)
    scored = [x for x in evals if x.scored]
    wrong_start = sum(x.response.startswith("z ") for x in scored)
    assert got.generated == 2 * SPOT_CHECK and got.cut == wrong_start - SPOT_CHECK  # nothing else generated
    assert exact_match(scored, got.answers) == exact_match(scored, want)
    assert all(w.startswith(a) and a for a, w in zip(got.answers, want))
    assert sum(a != w for a, w in zip(got.answers, want)) <= got.cut  # only cut ones can be shorter


def test_greedy_answers_generate_every_answer_when_generation_config_is_not_greedy(copier, caplog):
    model, tok, evals = copier
    model.generation_config.repetition_penalty = 3.0  # generate() now avoids tokens the prompt holds
    try:
        got = greedy_answers(model, tok, evals, max_length=32, batch_size=8, max_new_tokens=8, progress=False)
        assert "differs" not in caplog.text  # known from the config, before any spot check
        assert got.generated == sum(x.scored for x in evals)
        assert got.answers == _generated_all(model, tok, evals)
    finally:
        model.generation_config.repetition_penalty = None


@pytest.mark.parametrize("complete", [True, False])
def test_greedy_answers_generate_every_answer_when_a_spot_check_differs(copier, complete):
    model, tok, evals = copier
    z = tok.convert_tokens_to_ids("z")
    # a model whose generate() (cached steps: one position per row) disagrees with its full-sequence logits
    handle = model.get_output_embeddings().register_forward_hook(
        lambda mod, inp, out: out.index_add(-1, torch.tensor([z]), torch.full((*out.shape[:-1], 1), 50.0))
        if inp[0].dim() == 3 and inp[0].shape[1] == 1 else out)
    try:
        got = greedy_answers(model, tok, evals, max_length=32, batch_size=8, max_new_tokens=8, progress=False,
                             complete=complete)
        want = _generated_all(model, tok, evals)
        assert all(a.startswith("z") for a in want)  # the hook really changed generation
        assert got.answers == want and got.generated == sum(x.scored for x in evals)
    finally:
        handle.remove()
