import json

import pytest

from clusterft.config import DataConfig
from clusterft.data import IGNORE_INDEX, DataError, collate, encode, load_jsonl, per_sample_loss

T = DataConfig().prompt_template


def write(tmp_path, lines, name="d.jsonl", raw=None):
    p = tmp_path / name
    if raw is not None:
        p.write_bytes(raw)
    else:
        p.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return p


def test_alpaca_and_chat_forms_load(tmp_path):
    p = write(tmp_path, [
        {"instruction": "Reverse", "input": "a b", "output": "b a", "skill": "reverse"},
        {"instruction": "Say hi", "output": "hi"},
        {"messages": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": "4"}]},
    ])
    ex = load_jsonl(p, T)
    assert ex[0].prompt == "Instruction: Reverse\nInput: a b\nResponse:" and ex[0].response == "b a"
    assert ex[0].skill == "reverse"
    assert "Input:" not in ex[1].prompt
    assert ex[2].prompt == "System: Be brief\nUser: 2+2?\nAssistant:" and ex[2].response == "4"


def test_ids_are_stable_and_unique(tmp_path):
    rec = {"instruction": "x", "output": "y"}
    a = load_jsonl(write(tmp_path, [rec, rec, {"id": 7, **rec}]), T)
    b = load_jsonl(write(tmp_path, [{"instruction": "z", "output": "w"}, rec, rec], "e.jsonl"), T)
    assert a[0].id == b[1].id and a[1].id == b[2].id  # content hash, not position
    assert len({e.id for e in a}) == 3 and a[2].id == "7"


@pytest.mark.parametrize(
    "lines, raw, match",
    [
        (['{"instruction": "x", "output": '], None, r":1: invalid JSON"),
        ([{"instruction": "x", "output": "y"}, {"instruction": "x"}], None, r":2: missing field 'output'"),
        ([{"instruction": "  ", "output": "y"}], None, r":1: field 'instruction' is empty"),
        ([{"instruction": "x", "output": 3}], None, r":1: field 'output' must be a string, got int"),
        ([{"instruction": "x", "input": None, "output": "y"}], None, r"field 'input' must be a string"),
        ([{"prompt": "x"}], None, r"neither Alpaca form"),
        ([[1, 2]], None, r"expected a JSON object, got list"),
        ([{"messages": []}], None, r"'messages' must be a non-empty list"),
        ([{"messages": [{"role": "user", "content": "hi"}]}], None, r"last message must come from the assistant"),
        ([{"messages": [{"role": "bot", "content": "hi"}]}], None, r"messages\[0\]: field 'role' must be one of"),
        ([{"id": "a", "instruction": "x", "output": "y"}, {"id": "a", "instruction": "z", "output": "y"}],
         None, r":2: duplicate id 'a' \(first seen on line 1\)"),
        ([{"instruction": "x", "output": "y", "skill": 5}], None, r"field 'skill' must be a string"),
        ([], b"", r"no records \(the file is empty\)"),
        ([], b'{"instruction": "x", "output": "\xff"}\n', r":1: not valid UTF-8"),
    ],
)
def test_bad_input_names_file_line_and_field(tmp_path, lines, raw, match):
    p = write(tmp_path, lines, raw=raw)
    with pytest.raises(DataError, match=match) as e:
        load_jsonl(p, T)
    assert str(p) in str(e.value)


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_jsonl(tmp_path / "nope.jsonl", T)


@pytest.fixture(scope="module")
def tokenizer():
    from clusterft.model import train_tokenizer

    return train_tokenizer(["Instruction: copy\nInput: a b c\nResponse: a b c"] * 20, 300)


def test_encode_masks_prompt_and_appends_eos(tokenizer, tmp_path):
    ex = load_jsonl(write(tmp_path, [{"instruction": "copy", "input": "a b c", "output": "a b c"}]), T)[0]
    enc = encode(ex, tokenizer, 64)
    n_prompt = len(tokenizer(ex.prompt)["input_ids"])
    assert enc.labels[:n_prompt] == [IGNORE_INDEX] * n_prompt
    assert enc.labels[n_prompt:] == enc.input_ids[n_prompt:]
    assert enc.input_ids[-1] == tokenizer.eos_token_id and not enc.truncated
    assert tokenizer.decode(enc.input_ids[n_prompt:-1]).strip() == "a b c"


def test_truncation_keeps_response_and_is_counted(tokenizer, tmp_path):
    ex = load_jsonl(write(tmp_path, [{"instruction": "copy " * 30, "input": "a", "output": "a b c"}]), T)[0]
    enc = encode(ex, tokenizer, 10)
    assert enc.truncated and enc.n_tokens == 10
    # the prompt is cut from the left; the first response token survives as the target
    first_resp = tokenizer(" a b c", add_special_tokens=False)["input_ids"][0]
    assert enc.labels[-1] == enc.input_ids[-1] == first_resp
    assert sum(l != IGNORE_INDEX for l in enc.labels) == 1


def test_truncation_report_counts_and_warns_above_five_percent(tokenizer, tmp_path, caplog):
    from clusterft.data import encode_all, truncation_report

    recs = [{"instruction": "copy " * 30, "input": "a", "output": "a"}] + [
        {"instruction": "copy", "input": f"{i}", "output": "x"} for i in range(9)]
    enc = encode_all(load_jsonl(write(tmp_path, recs), T), tokenizer, 40)
    with caplog.at_level("WARNING"):
        rep = truncation_report(enc, "train", 40)
    assert rep["n"] == 10 and rep["n_truncated"] == 1 and rep["truncated_fraction"] == 0.1
    assert "1 of 10 samples (10%) are longer than data.max_length=40" in caplog.text
    caplog.clear()
    truncation_report(enc[1:], "train", 40)
    assert caplog.text == ""


def test_per_sample_loss_ignores_prompt_and_padding(tokenizer, tmp_path):
    import torch

    exs = load_jsonl(write(tmp_path, [{"instruction": "copy", "input": "a", "output": "a"},
                                      {"instruction": "copy", "input": "a b c", "output": "a b c"}]), T)
    batch = collate([encode(e, tokenizer, 64) for e in exs], tokenizer.pad_token_id)
    torch.manual_seed(0)
    logits = torch.randn(*batch["input_ids"].shape, len(tokenizer))
    got = per_sample_loss(logits, batch["labels"])
    for i in range(2):
        lab = batch["labels"][i, 1:]
        keep = lab != IGNORE_INDEX
        want = torch.nn.functional.cross_entropy(logits[i, :-1][keep], lab[keep])
        assert torch.allclose(got[i], want, atol=1e-6)


def test_chat_template_rendering_loss_only_records_and_bom(tmp_path, tokenizer):
    from clusterft.data import chat_renderer

    tokenizer.chat_template = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}[assistant]\n{% endif %}")
    render = chat_renderer(tokenizer, T, system_prompt="Be brief.")
    raw = ("\ufeff" + json.dumps({"instruction": "Reverse", "input": "a b", "output": "b a"}) + "\n"
           + json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                         "exact_match": False}) + "\n").encode("utf-8")
    ex = load_jsonl(write(tmp_path, [], raw=raw), render)
    assert ex[0].prompt == "[system] Be brief.\n[user] Reverse\n\na b\n[assistant]\n"
    assert ex[0].scored and not ex[1].scored
    enc = encode(ex[0], tokenizer, 64)  # the prompt ends in a newline: no space before the answer
    answer = [t for t, lab in zip(enc.input_ids, enc.labels) if lab != IGNORE_INDEX][:-1]
    assert tokenizer.decode(answer) == "b a"
    with pytest.raises(DataError, match="'exact_match' must be true or false"):
        load_jsonl(write(tmp_path, [{"instruction": "x", "output": "y", "exact_match": "no"}]), render)
