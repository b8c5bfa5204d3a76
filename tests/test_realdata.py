"""The real-model profile on a handful of samples: the skill mixture, chat-template
rendering, proxy features and LoRA training, through profiles/smollm2.yaml's own settings
(only paths and sizes overridden); the SmolLM2 run itself is a benchmark (BENCHMARKS.md)."""

from collections import Counter

import pytest

from clusterft.realdata import KNOWN_SKILLS, MIXTURES, SKILLS, chat_splits, data_properties, skill_records, write_splits
from tests.conftest import REPO

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def test_skill_mixture_is_imbalanced_redundant_and_balanced_on_test():
    s = skill_records(2000, 10, seed=0)
    sizes = Counter(r["skill"] for r in s["train"])
    assert len(sizes) == len(SKILLS) >= 8 and sum(sizes.values()) == 2000
    assert sizes[SKILLS[0][0]] / sizes[SKILLS[-1][0]] > 20  # a redundant head, a rare tail
    head = [(r["input"], r["output"]) for r in s["train"] if r["skill"] == SKILLS[0][0]]
    assert len(set(head)) <= 40 < len(head)  # exact copies of a small pool
    assert set(Counter(r["skill"] for r in s["test"]).values()) == {10}
    assert skill_records(2000, 10, seed=0) == s  # seeded


def test_redundant_mixture_has_the_properties_it_was_fixed_with():
    skills, sizes = MIXTURES["redundant"]
    s = skill_records(sizes["n_train"], 5, seed=0, n_val_per_skill=5, skills=skills)
    chat = [{"instruction": f"q{i}", "output": "a", "skill": f"chat:{i % 4}", "exact_match": False} for i in range(300)]
    props = data_properties(s["train"] + chat)
    assert props["n_train"] >= 3000 and props["n_skills"] == len(KNOWN_SKILLS) >= 10
    assert props["head_tail_ratio"] >= 30 and props["phrasings_per_skill"] >= 3
    assert props["head_exact_copy_fraction"] > 0.5 and props["open_ended_sources"] == 4
    assert set(Counter(r["skill"] for r in s["validation"]).values()) == {5}


def test_mixture_caps_open_ended_validation_per_source(monkeypatch):
    import clusterft.realdata as realdata

    pairs = [{"instruction": f"q{i}", "output": "a", "skill": f"src{i % 3}"} for i in range(300)]
    monkeypatch.setattr(realdata, "chatterbot_records", lambda: pairs)  # the corpus is a PyPI package, not in CI
    skills, sizes = MIXTURES["redundant"]
    out = realdata.mixture(**{**sizes, "n_train": 400}, skills=skills)
    chat_val = Counter(r["skill"] for r in out["validation"] if r.get("exact_match") is False)
    assert chat_val == {"chat:src0": 3, "chat:src1": 3, "chat:src2": 3}
    assert len(out["validation"]) == 9 + sizes["n_val_per_skill"] * len(skills)
    uncapped = realdata.mixture(400, 5, 10, n_val_per_skill=5)  # the step-limited profile keeps all
    assert sum(r.get("exact_match") is False for r in uncapped["validation"]) == 30  # 10% of each source


def test_data_properties_count_copies_and_phrasings():
    rows = [{"instruction": p, "input": "x", "output": "y", "skill": "a"} for p in ("p", "p", "p", "q")]
    rows += [{"instruction": "p", "input": str(i), "output": "y", "skill": "b"} for i in range(2)]
    props = data_properties(rows)
    assert props["skills"] == {"a": 4, "b": 2} and props["head_tail_ratio"] == 2
    assert props["head_exact_copy_fraction"] == 0.5 and props["phrasings_per_skill"] == 1
    assert props["exact_copy_fraction"] == pytest.approx(2 / 6)


def test_chat_sources_are_loss_only_and_in_every_split():
    recs = [{"instruction": f"q{i}", "output": f"a{i}", "skill": src} for src in ("x", "y") for i in range(20)]
    sp = chat_splits(recs, seed=0)
    assert all(r["exact_match"] is False and r["skill"].startswith("chat:") for v in sp.values() for r in v)
    assert {r["skill"] for r in sp["validation"]} == {"chat:x", "chat:y"}


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """The built-in tiny model with a chat template (stands in for SmolLM2-Instruct)."""
    from clusterft.runtime.model import load_tokenizer, prepare_builtin
    from clusterft.spec.config import load_config

    out = tmp_path_factory.mktemp("chat") / "model"
    cfg = load_config(None, ["model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
                             "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400"])
    texts = [f"<|user|>{r['instruction']} {r['input']}\n<|assistant|>\n{r['output']}"
             for r in skill_records(300, 2)["train"]]
    prepare_builtin(cfg, texts, out)
    tok = load_tokenizer(out)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    return out


def test_real_profile_settings_run_end_to_end_on_a_handful_of_samples(tmp_path, chat_model):
    import json

    from clusterft.orchestration.launch import launch, stage_functions
    from clusterft.spec.config import load_config

    splits = skill_records(160, 2, seed=1)
    chat = chat_splits([{"instruction": f"hello {i}", "output": f"hi there {i % 3}", "skill": "greetings"}
                        for i in range(30)])
    splits["train"] += chat["train"]
    splits["validation"] += chat["validation"]
    write_splits(splits, tmp_path / "data")
    sets = [f"paths.artifacts={tmp_path / 'art'}", f"model.path={chat_model}",
            *[f"data.{s}={tmp_path / 'data' / (s + '.jsonl')}" for s in ("train", "validation", "test")],
            "lora.target_modules=[q_proj, v_proj]", "cluster.k=4", "train.per_device_batch=4",
            "warmup.fraction=0.5", "evaluate.max_new_tokens=8", "select.methods=[full, cluster]",
            "features.model=proxy"]  # the profile's MiniLM folder is linked by realdata (no CI)
    params = str(REPO / "profiles" / "smollm2.yaml")
    cfg = load_config(params, sets)
    assert cfg.data.chat_template and cfg.train.finetune == "lora"
    fns = stage_functions()
    for name in ("warmup", "features", "cluster"):
        fns[name](cfg)
    for m in cfg.select.methods:
        fns["select"](cfg, m)
        fns["allocate"](cfg, m)
        launch(cfg.train.nproc, ["train", "--params", params, "--method", m,
                                 *[a for s in sets for a in ("--set", s)]])
        ev = fns["evaluate"](cfg, m)
        assert ev["split"] == "test" and ev["n_scored"] == 2 * len(SKILLS)
        assert ev["samples"][0]["prompt"].startswith("<|system|>Answer with the result only.\n<|user|>")
        assert ev["heldout_loss_open_ended"] > 0
    rows = {r["method"]: r for r in fns["compare"](cfg, track=False)["rows"]}
    assert rows["cluster"]["warmup_s"] > 0 and rows["cluster"]["kept_fraction"] == pytest.approx(0.3, abs=0.01)
    sel = json.loads((tmp_path / "art/methods/cluster/select_metrics.json").read_text())
    assert sel["kept_distinct"] == sel["n_selected"]  # dedup: no copy while distinct ones remain


def test_proxy_warmup_reads_plain_text_like_its_features_while_target_reads_the_chat_template(tmp_path, chat_model):
    from clusterft.spec.config import load_config
    from clusterft.stages.warmup import warmup_examples

    write_splits(skill_records(40, 2, seed=2), tmp_path / "data")
    sets = [f"model.path={chat_model}",
            *[f"data.{s}={tmp_path / 'data' / (s + '.jsonl')}" for s in ("train", "validation", "test")]]
    params = str(REPO / "profiles" / "smollm2.yaml")
    proxy = warmup_examples(load_config(params, [*sets, "features.model=proxy"]))
    target = warmup_examples(load_config(params, [*sets, "features.model=target"]))
    assert not any("<|user|>" in e.prompt for e in proxy)  # the proxy's features use plain prompts
    assert all(e.prompt.startswith("<|system|>") for e in target)
