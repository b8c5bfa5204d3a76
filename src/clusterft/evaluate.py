"""Evaluation: greedy generation scored by exact match per skill, plus held-out loss."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from clusterft.data import Example, collate, encode_all, per_sample_loss, truncation_report


def normalise_answer(text: str) -> str:
    """Exact match ignores surrounding and repeated whitespace only."""
    return " ".join(text.split())


@torch.no_grad()
def generate_answers(model: Any, tokenizer: Any, prompts: list[str], batch_size: int,
                     max_new_tokens: int) -> list[str]:
    """Greedy decoding with left padding; returns the decoded continuations (progress on stderr)."""
    from tqdm import tqdm

    model.eval()
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    answers: list[str] = []
    try:
        for i in tqdm(range(0, len(prompts), batch_size), desc="evaluate (generate)", unit="batch"):
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


def exact_match(examples: list[Example], answers: list[str]) -> dict[str, Any]:
    """Per-skill exact match, its macro mean and worst skill (skill 'all' when unlabelled).
    `examples` are the scored ones (see Example.scored), aligned with `answers`."""
    hits: dict[str, list[bool]] = defaultdict(list)
    for ex, ans in zip(examples, answers):
        hits[ex.skill or "all"].append(normalise_answer(ans) == normalise_answer(ex.response))
    if not hits:
        from clusterft.data import DataError

        raise DataError("no record to score by exact match (every one has \"exact_match\": false)")
    per_skill = {k: float(np.mean(v)) for k, v in sorted(hits.items())}
    worst = min(per_skill, key=per_skill.get)
    return {
        "exact_match": per_skill,
        "macro_exact_match": float(np.mean(list(per_skill.values()))),
        "worst_skill": worst,
        "worst_skill_exact_match": per_skill[worst],
        "micro_exact_match": float(np.mean([h for v in hits.values() for h in v])),
    }


@torch.no_grad()
def heldout_loss(model: Any, tokenizer: Any, examples: list[Example], max_length: int,
                 batch_size: int) -> dict[str, float]:
    """Mean response-token loss over samples, overall and per skill/source."""
    model.eval()
    enc = encode_all(examples, tokenizer, max_length)
    losses: list[float] = []
    for i in range(0, len(enc), batch_size):
        b = {k: v.to(model.device) for k, v in collate(enc[i : i + batch_size], tokenizer.pad_token_id).items()}
        out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
        losses += per_sample_loss(out.logits, b["labels"]).tolist()
    by: dict[str, list[float]] = defaultdict(list)
    for ex, l in zip(examples, losses):
        by[ex.skill or "all"].append(l)
    open_ended = [l for ex, l in zip(examples, losses) if not ex.scored]
    return {"heldout_loss": float(np.mean(losses)),
            "heldout_loss_open_ended": float(np.mean(open_ended)) if open_ended else float("nan"),
            "heldout_loss_by_skill": {k: float(np.mean(v)) for k, v in sorted(by.items())}}


def check_skills(test: list[Example], train: list[Example], test_path: str, train_path: str) -> None:
    """Every skill label in the test split must occur in train (else it cannot be scored fairly)."""
    from clusterft.data import DataError

    known = {e.skill for e in train if e.skill}
    for ex in test:
        if ex.skill and ex.skill not in known:
            raise DataError(
                f"{test_path}:{ex.meta.get('line', '?')}: skill '{ex.skill}' does not occur in "
                f"{train_path} (known: {', '.join(sorted(known)) or 'none'})"
            )


def evaluate_model(cfg: Any, model_dir: Any) -> dict:
    """Exact match on `evaluate.split` and held-out loss on validation, of one saved model."""
    from clusterft.data import load_examples, renderer
    from clusterft.model import load_model, load_tokenizer
    from clusterft.train_loop import autocast

    tokenizer = load_tokenizer(model_dir, cfg.model)
    model = load_model(model_dir, cfg.model)
    render = renderer(cfg)
    e, split = cfg.evaluate, cfg.evaluate.split
    train = load_examples(cfg, "train", render)
    validation = load_examples(cfg, "validation", render)

    def score(examples: list[Example], path: str) -> tuple[dict, list[Example], list[str]]:
        scored = [x for x in examples if x.scored]
        check_skills(scored, train, path, cfg.data.train)
        with autocast(cfg.train.precision, model.device):
            answers = generate_answers(model, tokenizer, [x.prompt for x in scored], e.batch_size,
                                       e.max_new_tokens)
        return exact_match(scored, answers), scored, answers

    examples = validation if split == "validation" else load_examples(cfg, split, render)
    em, scored, answers = score(examples, getattr(cfg.data, split))
    metrics = {"split": split, "n_scored": len(scored), **em}
    metrics["truncation"] = {s: truncation_report(encode_all(xs, tokenizer, cfg.data.max_length), s,
                                                  cfg.data.max_length)
                             for s, xs in {split: examples, "validation": validation}.items()}
    if split == "test" and e.also_validation and any(x.scored for x in validation):
        metrics["validation"] = score(validation, cfg.data.validation)[0]
    with autocast(cfg.train.precision, model.device):
        metrics.update(heldout_loss(model, tokenizer, validation, cfg.data.max_length, e.batch_size))
    metrics["samples"] = [{"prompt": x.prompt, "answer": a, "expected": x.response}
                          for x, a in list(zip(scored, answers))[:5]]
    return metrics


def run_evaluate(cfg: Any, method: str, run: str | None = None) -> dict:
    """Stage `evaluate`: methods/<method>/eval.json from methods/<method>/model/."""
    from clusterft.artifacts import write_json

    start = time.perf_counter()
    mdir = cfg.method_dir(method, run)
    metrics = {"method": method, **evaluate_model(cfg, mdir / "model")}
    metrics["wall_clock_s"] = time.perf_counter() - start
    write_json(mdir / "eval.json", metrics)
    return metrics


def run_zero_shot(cfg: Any) -> dict:
    """The untrained base model's scores (the floor fine-tuning lifts): baseline/eval.json."""
    from clusterft.artifacts import write_json
    from clusterft.model import base_model_dir

    start = time.perf_counter()
    metrics = {"method": "zero_shot", **evaluate_model(cfg, base_model_dir(cfg))}
    metrics["wall_clock_s"] = time.perf_counter() - start
    write_json(cfg.artifact("baseline", "eval.json"), metrics)
    return metrics
