"""Evaluation: greedy generation scored by exact match per skill, plus held-out loss."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from clusterft.data import Example, collate, encode_all, per_sample_loss


def normalise_answer(text: str) -> str:
    """Exact match ignores surrounding and repeated whitespace only."""
    return " ".join(text.split())


@torch.no_grad()
def generate_answers(model: Any, tokenizer: Any, prompts: list[str], batch_size: int,
                     max_new_tokens: int) -> list[str]:
    """Greedy decoding with left padding; returns the decoded continuations."""
    model.eval()
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    answers: list[str] = []
    try:
        for i in range(0, len(prompts), batch_size):
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
    """Per-skill exact match, its macro mean and worst skill (skill 'all' when unlabelled)."""
    hits: dict[str, list[bool]] = defaultdict(list)
    for ex, ans in zip(examples, answers):
        hits[ex.skill or "all"].append(normalise_answer(ans) == normalise_answer(ex.response))
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
    return {"heldout_loss": float(np.mean(losses)),
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


def run_evaluate(cfg: Any, method: str, run: str | None = None) -> dict:
    """Stage `evaluate`: methods/<method>/eval.json from methods/<method>/model/."""
    from clusterft.artifacts import write_json
    from clusterft.data import load_examples
    from clusterft.model import load_model, load_tokenizer

    start = time.perf_counter()
    mdir = cfg.method_dir(method, run)
    tokenizer = load_tokenizer(mdir / "model", cfg.model)
    model = load_model(mdir / "model", cfg.model)
    test = load_examples(cfg, "test")
    check_skills(test, load_examples(cfg, "train"), cfg.data.test, cfg.data.train)
    e = cfg.evaluate
    answers = generate_answers(model, tokenizer, [x.prompt for x in test], e.batch_size, e.max_new_tokens)
    metrics = {"method": method, "n_test": len(test), **exact_match(test, answers)}
    metrics.update(heldout_loss(model, tokenizer, load_examples(cfg, "validation"),
                                cfg.data.max_length, e.batch_size))
    metrics["wall_clock_s"] = time.perf_counter() - start
    write_json(mdir / "eval.json", metrics)
    return metrics
