"""Stage `evaluate`: greedy answers scored by exact match per skill (on `evaluate.split`;
validation too when the split is test) and held-out loss, of one saved model."""

from __future__ import annotations

import time
from typing import Any

from clusterft.core.scoring import check_skills, exact_match
from clusterft.core.tokens import Example, encode_all, truncation_report
from clusterft.io.artifacts import write_json
from clusterft.runtime.data import load_examples, renderer
from clusterft.runtime.generation import Answered, greedy_answers, loss_summary, sample_losses
from clusterft.runtime.model import base_model_dir, load_model, load_tokenizer
from clusterft.runtime.precision import autocast


def evaluate_model(cfg: Any, model_dir: Any) -> dict:
    """Exact match on `evaluate.split` and held-out loss on validation, of one saved model."""
    tokenizer = load_tokenizer(model_dir, cfg.model)
    model = load_model(model_dir, cfg.model)
    render = renderer(cfg)
    e, split = cfg.evaluate, cfg.evaluate.split
    train = load_examples(cfg, "train", render)
    validation = load_examples(cfg, "validation", render)

    def score(examples: list[Example], path: str, losses: bool) -> tuple[dict, list[Example], Answered]:
        """Exact match of the scored rows; `losses`: every row's held-out loss too (else scored rows only)."""
        scored = [x for x in examples if x.scored]
        check_skills(scored, train, path, cfg.data.train)
        with autocast(cfg.train.precision, model.device):
            got = greedy_answers(model, tokenizer, examples if losses else scored, cfg.data.max_length,
                                 e.batch_size, e.max_new_tokens)
        return exact_match(scored, got.answers), scored, got

    examples = validation if split == "validation" else load_examples(cfg, split, render)
    em, scored, got = score(examples, getattr(cfg.data, split), losses=split == "validation")
    metrics = {"split": split, "n_scored": len(scored), "n_generated": got.generated, **em}
    metrics["truncation"] = {s: truncation_report(encode_all(xs, tokenizer, cfg.data.max_length), s,
                                                  cfg.data.max_length)
                             for s, xs in {split: examples, "validation": validation}.items()}
    val_losses = got.losses if split == "validation" else None
    if split == "test" and e.also_validation and any(x.scored for x in validation):
        metrics["validation"], _, val = score(validation, cfg.data.validation, losses=True)
        val_losses = val.losses
    if val_losses is None:
        with autocast(cfg.train.precision, model.device):
            val_losses = sample_losses(model, tokenizer, validation, cfg.data.max_length, e.batch_size)
    metrics.update(loss_summary(validation, val_losses))
    metrics["samples"] = [{"prompt": x.prompt, "answer": a, "expected": x.response}
                          for x, a in list(zip(scored, got.answers))[:5]]
    return metrics


def run_evaluate(cfg: Any, method: str, run: str | None = None) -> dict:
    """Stage `evaluate`: methods/<method>/eval.json from methods/<method>/model/."""
    start = time.perf_counter()
    mdir = cfg.method_dir(method, run)
    metrics = {"method": method, **evaluate_model(cfg, mdir / "model")}
    metrics["wall_clock_s"] = time.perf_counter() - start
    write_json(mdir / "eval.json", metrics)
    return metrics


def run_zero_shot(cfg: Any) -> dict:
    """The untrained base model's scores (the floor fine-tuning lifts): baseline/eval.json."""
    start = time.perf_counter()
    metrics = {"method": "zero_shot", **evaluate_model(cfg, base_model_dir(cfg))}
    metrics["wall_clock_s"] = time.perf_counter() - start
    write_json(cfg.artifact("baseline", "eval.json"), metrics)
    return metrics
