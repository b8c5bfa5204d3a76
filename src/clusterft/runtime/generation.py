"""A model's greedy answers (read off a teacher-forced pass where they can be, else batched greedy
generation) and its held-out loss per skill."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from clusterft.core.losses import ResponseLoss
from clusterft.core.scoring import hit_pairs, may_still_match, summarise_hits
from clusterft.core.tokens import IGNORE_INDEX, Encoded, Example, collate, encode_all, shared_prefix, starts_with
from clusterft.runtime import parallel
from clusterft.runtime.distributed import gather_objects
from clusterft.runtime.precision import autocast

log = logging.getLogger(__name__)


@torch.no_grad()
def generate_answers(model: Any, tokenizer: Any, prompts: list[str], batch_size: int,
                     max_new_tokens: int, progress: bool = True) -> list[str]:
    """Greedy decoding with left padding; returns the decoded continuations (progress on stderr)."""
    model.eval()
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    answers: list[str] = []
    try:
        for i in tqdm(range(0, len(prompts), batch_size), desc="evaluate (generate)", unit="batch",
                      disable=not progress):
            enc = tokenizer(prompts[i : i + batch_size], return_tensors="pt", padding=True)
            enc = {k: v.to(model.device) for k, v in enc.items()}
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
            new = out[:, enc["input_ids"].shape[1]:]
            answers += tokenizer.batch_decode(new, skip_special_tokens=True)
    finally:
        tokenizer.padding_side = old_side
    return answers


@torch.no_grad()
def teacher_forced(model: Any, tokenizer: Any, examples: list[Example], max_length: int, batch_size: int,
                   loss: ResponseLoss | None = None) -> tuple[list[float], list[list[int]], list[Encoded]]:
    """Each sample's mean response-token loss, the model's top token at each of its answer
    positions (see ResponseLoss.with_top), and its encoding, in `examples` order.
    Batches group samples of similar length (less padding) and the output layer runs at answer
    positions only: on a 49k vocabulary the full logits of prompt and pad tokens were most of the cost.
    The tokens the rows start with (system prompt, chat template) are run once (shared_prefix):
    a batch whose rows all start with them takes them from a cache."""
    model.eval()
    loss = loss or ResponseLoss(model)
    enc = encode_all(examples, tokenizer, max_length)
    prefix = shared_prefix(enc)
    past = loss.prefix(prefix) if prefix else None
    order = sorted(range(len(enc)), key=lambda i: enc[i].n_tokens)
    losses, top = [0.0] * len(enc), [[] for _ in enc]
    for i in range(0, len(order), batch_size):
        rows = order[i : i + batch_size]
        b = {k: v.to(model.device) for k, v in collate([enc[r] for r in rows], tokenizer.pad_token_id).items()}
        cut = past if past is not None and all(starts_with(enc[r], prefix) for r in rows) else None
        got, tokens = loss.with_top(model, b, cut)
        for r, v, t in zip(rows, got.tolist(), tokens.tolist()):
            losses[r], top[r] = v, [x for x in t if x != IGNORE_INDEX]
    return losses, top, enc


def sample_losses(model: Any, tokenizer: Any, examples: list[Example], max_length: int,
                  batch_size: int, loss: ResponseLoss | None = None) -> list[float]:
    """Each sample's mean response-token loss, in `examples` order (teacher_forced)."""
    return teacher_forced(model, tokenizer, examples, max_length, batch_size, loss)[0]


SPOT_CHECK = 4  # answers taken from the teacher-forced pass that are also generated, and compared
# generation settings under which generate() picks other tokens than the logits' top one (or
# stops elsewhere): a model whose generation_config sets any of them has every answer generated
NOT_GREEDY = {"num_beams": 1, "penalty_alpha": 0, "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0,
              "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None,
              "sequence_bias": None, "suppress_tokens": None, "begin_suppress_tokens": None, "min_length": 0,
              "min_new_tokens": 0, "forced_bos_token_id": None, "forced_eos_token_id": None,
              "exponential_decay_length_penalty": None, "dola_layers": None, "guidance_scale": 1.0,
              "watermarking_config": None, "max_time": None}


def decodes_by_top_token(model: Any) -> bool:
    """True when the model's generation_config leaves greedy decoding alone (NOT_GREEDY unset)."""
    gc = getattr(model, "generation_config", None)
    return gc is not None and all(getattr(gc, k, None) in (None, neutral) for k, neutral in NOT_GREEDY.items())


@dataclass
class Answered:
    """The greedy answers of the scored examples (in order), every example's held-out loss, how
    many answers were generated (the rest were read off the teacher-forced pass) and how many of
    those read are only the start of a wrong answer (greedy_answers' `complete`)."""

    answers: list[str]
    losses: list[float]
    generated: int
    cut: int


def _written(tokenizer: Any, answer: list[int], top: list[int]) -> tuple[int, str, bool]:
    """What greedy decoding writes where the model's top tokens at the answer positions are
    `top`: it follows the reference `answer` (its last token EOS) up to the first position j
    where they differ, then writes top[j]. (tokens written, their text, whether that is the
    whole answer: the reference through its EOS, or an EOS at j)."""
    j = next((k for k, (p, a) in enumerate(zip(top, answer)) if p != a), len(answer))
    if j == len(answer):
        return j, tokenizer.decode(answer[:-1], skip_special_tokens=True), True
    if top[j] == tokenizer.eos_token_id:
        return j + 1, tokenizer.decode(answer[:j], skip_special_tokens=True), True
    return j + 1, tokenizer.decode(answer[:j] + [top[j]], skip_special_tokens=True), False


def _spread(rows: list[int]) -> list[int]:
    """Up to SPOT_CHECK of `rows`, spread over them."""
    return rows[:: max(1, len(rows) // SPOT_CHECK)][:SPOT_CHECK]


def greedy_answers(model: Any, tokenizer: Any, examples: list[Example], max_length: int, batch_size: int,
                   max_new_tokens: int, loss: ResponseLoss | None = None, progress: bool = True,
                   complete: bool = True) -> Answered:
    """Greedy answers and held-out losses from one teacher-forced pass plus generation where it
    is needed. Greedy decoding from the prompt follows the reference answer for as long as the
    model's top token is the reference's, then writes its own top token (up to floating-point
    near-ties, as a change of generation batch size can flip), so where the top tokens match
    the reference through its EOS, or end in an EOS of their own, the whole answer is read off
    the pass. With `complete` False (curve points, which only score), a row whose first wrong
    token already rules out a match (its text without whitespace is no prefix of the
    reference's) keeps that start of its answer and is not generated either. The other scored
    rows (and any cut by max_length, longer than max_new_tokens or holding an EOS inside) are
    generated. Every row is generated for a model whose generation_config changes greedy
    decoding (NOT_GREEDY), and when any of SPOT_CHECK read-off answers (and of SPOT_CHECK
    starts), generated too, differs."""
    losses, top, enc = teacher_forced(model, tokenizer, examples, max_length, batch_size, loss)
    read: dict[int, str] = {}  # whole answers
    heads: dict[int, str] = {}  # starts of wrong answers
    plain = decodes_by_top_token(model)
    for i, (ex, e, t) in enumerate(zip(examples, enc, top)):
        answer = [x for x in e.labels if x != IGNORE_INDEX]
        if not (plain and ex.scored and not e.truncated  # generation would stop at an inner EOS:
                and tokenizer.eos_token_id not in answer[:-1]):
            continue
        n, text, whole = _written(tokenizer, answer, t)
        if n > max_new_tokens:
            continue
        if whole:
            read[i] = text
        elif not complete and "\ufffd" not in text and not may_still_match(text, ex.response):
            heads[i] = text
    scored = [i for i, ex in enumerate(examples) if ex.scored]
    check = _spread(list(read)) + _spread(list(heads))
    todo = check + [i for i in scored if i not in read and i not in heads]
    out = dict(zip(todo, generate_answers(model, tokenizer, [examples[i].prompt for i in todo], batch_size,
                                          max_new_tokens, progress)))
    off = [i for i in check if (out[i] != read[i] if i in read else not may_still_match(heads[i], out[i]))]
    if off:
        log.warning("greedy generation differs from the teacher-forced answers (e.g. %r against %r): "
                    "generating every answer", out[off[0]], read.get(off[0], heads.get(off[0])))
        rest = [i for i in scored if i not in out]
        out.update(zip(rest, generate_answers(model, tokenizer, [examples[i].prompt for i in rest], batch_size,
                                              max_new_tokens, progress)))
        read, heads = {}, {}
    answers = [out[i] if i in out else read.get(i, heads.get(i, "")) for i in scored]
    return Answered(answers, losses, len(out), sum(i not in out for i in heads))


def loss_summary(examples: list[Example], losses: list[float]) -> dict[str, Any]:
    """Mean response-token loss over samples, overall, on open-ended ones and per skill/source."""
    by: dict[str, list[float]] = defaultdict(list)
    for ex, l in zip(examples, losses):
        by[ex.skill or "all"].append(l)
    open_ended = [l for ex, l in zip(examples, losses) if not ex.scored]
    return {"heldout_loss": float(np.mean(losses)),
            "heldout_loss_open_ended": float(np.mean(open_ended)) if open_ended else float("nan"),
            "heldout_loss_by_skill": {k: float(np.mean(v)) for k, v in sorted(by.items())}}


def validation_point(model: Any, tokenizer: Any, examples: list[Example], cfg: Any, info: Any,
                     loss: ResponseLoss | None = None) -> dict[str, float]:
    """Validation macro / worst-skill / per-skill exact match and held-out loss of a model as it trains
    (a point of its curve, evaluate.every): each rank scores the rows rank::world and the
    results are gathered, so the point costs 1/world of a whole evaluation. Every rank
    returns the same figures; the model is back in training mode afterwards."""
    inner, e = parallel.unwrap(model), cfg.evaluate
    share = examples[info.rank::info.world_size]
    scored = [x for x in share if x.scored]
    with autocast(cfg.train.precision, info.device):
        got = greedy_answers(inner, tokenizer, share, cfg.data.max_length, e.batch_size, e.max_new_tokens, loss,
                             progress=False, complete=False)
    model.train()
    parts = gather_objects((hit_pairs(scored, got.answers), got.losses))
    em = summarise_hits([h for hits, _ in parts for h in hits])
    all_losses = [v for _, ls in parts for v in ls]
    return {"val_macro_em": em["macro_exact_match"], "val_worst_skill_em": em["worst_skill_exact_match"],
            "val_heldout_loss": float(np.mean(all_losses)), "val_skill_em": em["exact_match"]}
