"""Tokenization: the prompt is masked, EOS appended, long samples cut from the prompt side and counted."""



from clusterft.core.tokens import IGNORE_INDEX, Encoded, encode, shared_prefix, starts_with
from clusterft.io.examples import load_jsonl
from tests.helpers.data_case import T, write


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
    from clusterft.core.tokens import encode_all, truncation_report

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


def _row(ids: list[int], prompt: int, truncated: bool = False) -> Encoded:
    return Encoded(id="r", input_ids=ids, labels=[IGNORE_INDEX] * prompt + ids[prompt:], truncated=truncated)


def test_shared_prefix_stops_at_the_first_differing_token_and_before_any_answer_token():
    system = [1, 7, 7, 3]
    assert shared_prefix([_row(system + [5, 9, 2], 6), _row(system + [6, 9, 9, 2], 6)]) == system
    # the answer starts at 4 in the second row: its predictor (position 3) must run, so 3 are shared
    assert shared_prefix([_row(system + [5, 9, 2], 6), _row(system + [5, 9, 2], 4)]) == system[:3]
    # identical rows still keep a token each to run the decoder on
    assert shared_prefix([_row([1, 7, 7], 3), _row([1, 7, 7], 3)]) == [1, 7]
    assert shared_prefix([_row([1, 7], 1), _row([2, 7], 1)]) == []
    assert shared_prefix([_row(system + [5, 2], 5)]) == []  # one row: nothing to share


def test_a_row_cut_from_the_prompt_side_neither_shortens_the_shared_prefix_nor_takes_it():
    system = [1, 7, 7, 3]
    cut = _row([7, 3, 5, 9, 2], 3, truncated=True)  # lost its first tokens to max_length
    rows = [_row(system + [5, 9, 2], 6), _row(system + [6, 9, 9, 2], 6), cut]
    assert shared_prefix(rows) == system
    assert [starts_with(r, system) for r in rows] == [True, True, False]
    assert not starts_with(_row(system + [5], 4), system)  # its answer's predictor is in the prefix
