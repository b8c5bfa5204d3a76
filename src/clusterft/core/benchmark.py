"""Built-in benchmark: a seeded mixture of deterministic skills checked by exact match.

Skill sizes follow a Zipf law (the head skill is >= 30x the rarest) and the head skills
are redundant: their inputs come from a small pool, repeated under several phrasings.
Letters and digits are space-separated so each one is its own token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

from clusterft.errors import ConfigError

LETTERS = "abcdefghij"


def _word(rng: random.Random, lo: int = 3, hi: int = 6) -> list[str]:
    return [rng.choice(LETTERS) for _ in range(rng.randint(lo, hi))]


def _spaced(chars: list[str] | str) -> str:
    return " ".join(chars)


@dataclass(frozen=True)
class Skill:
    name: str
    phrasings: tuple[str, ...]
    make: Callable[[random.Random, dict], tuple[str, str]]  # rng, tables -> (input, output)


def _copy(rng, _):
    w = _word(rng)
    return _spaced(w), _spaced(w)


def _upper(rng, _):
    w = _word(rng)
    return _spaced(w), _spaced([c.upper() for c in w])


def _reverse(rng, _):
    w = _word(rng)
    return _spaced(w), _spaced(w[::-1])


def _sort(rng, _):
    w = _word(rng, 3, 4)
    return _spaced(w), _spaced(sorted(w))


def _add(rng, _):
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return f"{a} + {b}", _spaced(str(a + b))


def _count(rng, _):
    w = _word(rng, 3, 5)
    target = rng.choice(w) if rng.random() < 0.8 else rng.choice(LETTERS)
    return f"{target} in {_spaced(w)}", str(w.count(target))


def _lookup(rng, tables):
    key = rng.choice(sorted(tables["lookup"]))
    return key, tables["lookup"][key]


def _last(rng, _):
    w = _word(rng)
    return _spaced(w), w[-1]


# Ordered head -> tail: the first skill is the biggest, the last the rarest.
SKILLS: tuple[Skill, ...] = (
    Skill("copy", ("Copy the letters", "Repeat the input", "Write the letters again"), _copy),
    Skill("upper", ("Make the letters upper case", "Capitalise every letter", "Upper case"), _upper),
    Skill("reverse", ("Reverse the letters", "Write the letters backwards", "Reverse"), _reverse),
    Skill("add", ("Add the numbers", "What is the sum", "Compute the sum"), _add),
    Skill("sort", ("Sort the letters", "Put the letters in order", "Sort"), _sort),
    Skill("count", ("Count the letter", "How many times does the letter occur", "Count"), _count),
    Skill("lookup", ("Look up the code word", "What is the code for", "Decode"), _lookup),
    Skill("last", ("Give the last letter", "Which letter comes last", "Last letter"), _last),
)


def skill_sizes(n: int, zipf_s: float, n_skills: int = len(SKILLS)) -> list[int]:
    """Split n samples over skills by a Zipf law, largest first; every skill gets >= 1
    (ValueError when n < n_skills)."""
    if n < n_skills:
        raise ValueError(f"{n} samples cannot give each of {n_skills} skills one (need >= {n_skills})")
    w = [1.0 / (r**zipf_s) for r in range(1, n_skills + 1)]
    total = sum(w)
    sizes = [max(1, int(n * x / total)) for x in w]
    sizes[0] += n - sum(sizes)
    return sizes


def _tables(rng: random.Random) -> dict:
    syll = ["zo", "ka", "mi", "ru", "te", "po", "la", "vi"]
    keys: set[str] = set()
    while len(keys) < 16:
        keys.add(rng.choice(syll) + rng.choice(syll))
    return {"lookup": {k: _spaced(_word(rng, 3, 3)) for k in sorted(keys)}}


def _sample(skill: Skill, rng: random.Random, tables: dict, pool: list | None) -> dict:
    if pool is not None:  # head skill: near-duplicates of a small set of items
        inp, out = rng.choice(pool)
    else:
        inp, out = skill.make(rng, tables)
    return {"instruction": rng.choice(skill.phrasings), "input": inp, "output": out, "skill": skill.name}


def generate(cfg: Any) -> dict[str, list[dict]]:
    """Return {'train', 'validation', 'test'} record lists (Alpaca form + `skill`, `id`)."""
    rng = random.Random(cfg.seed)
    tables = _tables(rng)
    n_head = 3  # skills whose inputs come from a small pool (redundant)
    pools = {
        s.name: [s.make(rng, tables) for _ in range(cfg.duplicate_pool)] if idx < n_head else None
        for idx, s in enumerate(SKILLS)
    }
    out: dict[str, list[dict]] = {}
    for split, n, balanced in (
        ("train", cfg.n_train, False),
        ("validation", cfg.n_validation, False),
        ("test", cfg.n_test_per_skill * len(SKILLS), True),
    ):
        try:
            sizes = [cfg.n_test_per_skill] * len(SKILLS) if balanced else skill_sizes(n, cfg.zipf_s)
        except ValueError as err:
            raise ConfigError(f"benchmark.n_{split}: {err}") from None
        records = [
            _sample(s, rng, tables, pools[s.name]) for s, k in zip(SKILLS, sizes) for _ in range(k)
        ]
        rng.shuffle(records)
        for i, r in enumerate(records):
            r["id"] = f"{split}-{i:06d}"
        out[split] = [{"id": r.pop("id"), **r} for r in records]
    return out
