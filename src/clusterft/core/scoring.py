"""Scoring answers: exact match per skill (whitespace aside), its macro mean and worst skill."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from clusterft.core.tokens import Example
from clusterft.errors import DataError


def normalise_answer(text: str) -> str:
    """Exact match ignores surrounding and repeated whitespace only."""
    return " ".join(text.split())


def may_still_match(start: str, text: str) -> bool:
    """Whether `text` can still be, by exact match (normalise_answer), an answer that begins
    with `start`: whitespace aside, `start` is a prefix of it."""
    return "".join(text.split()).startswith("".join(start.split()))


def exact_match(examples: list[Example], answers: list[str]) -> dict[str, Any]:
    """Per-skill exact match, its macro mean and worst skill (skill 'all' when unlabelled).
    `examples` are the scored ones (see Example.scored), aligned with `answers`."""
    return summarise_hits(hit_pairs(examples, answers))


def hit_pairs(examples: list[Example], answers: list[str]) -> list[tuple[str, bool]]:
    """(skill, exact hit) of each scored example and its answer (skill 'all' when unlabelled)."""
    return [(ex.skill or "all", normalise_answer(ans) == normalise_answer(ex.response))
            for ex, ans in zip(examples, answers)]


def summarise_hits(pairs: list[tuple[str, bool]]) -> dict[str, Any]:
    """exact_match's figures from (skill, hit) pairs (gathered from several ranks)."""
    hits: dict[str, list[bool]] = defaultdict(list)
    for skill, hit in pairs:
        hits[skill].append(hit)
    if not hits:
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


def check_skills(test: list[Example], train: list[Example], test_path: str, train_path: str) -> None:
    """Every skill label in the test split must occur in train (else it cannot be scored fairly)."""
    known = {e.skill for e in train if e.skill}
    for ex in test:
        if ex.skill and ex.skill not in known:
            raise DataError(
                f"{test_path}:{ex.meta.get('line', '?')}: skill '{ex.skill}' does not occur in "
                f"{train_path} (known: {', '.join(sorted(known)) or 'none'})"
            )
