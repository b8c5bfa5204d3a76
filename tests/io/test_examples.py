"""Instruction JSONL files: Alpaca and chat forms, stable ids, chat-template rendering, and bad
input named by file, line and field."""

import json

import pytest

from clusterft.core.tokens import IGNORE_INDEX, encode
from clusterft.errors import DataError
from clusterft.io.examples import load_jsonl
from tests.helpers.data_case import T, write


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












def test_chat_template_rendering_loss_only_records_and_bom(tmp_path, tokenizer):
    from clusterft.core.tokens import chat_renderer

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
