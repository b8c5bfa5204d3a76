"""Checkpoints survive the crashes that hit them: a kill between the two renames of the swap
(half-written), a corrupt file, a full disk while saving. Each resumes from the newest good
checkpoint or starts clean with a warning; a bad checkpoint never changes the model."""

import time

import pytest
import torch

from clusterft.errors import OutputError
from clusterft.runtime.checkpoint import load_checkpoint, save_checkpoint
from tests.helpers.limits import file_size_limit


class Position:
    """The plan position a checkpoint stores (the train loop's PlanSource has the same API)."""

    def __init__(self, value=0):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def _parts(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return model, opt, sched


def _step(model, opt, sched):
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    sched.step()
    opt.zero_grad()


def _save(ckpt, model, opt, sched, steps):
    save_checkpoint(ckpt, model, opt, sched, Position(steps), (0, steps), "run-a",
                    [{"step": s} for s in range(steps)])


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _one_checkpoint(tmp_path):
    """A model after one step and its checkpoint: (folder, model, opt, sched, weights then)."""
    model, opt, sched = _parts(0)
    ckpt = tmp_path / "checkpoint"
    _step(model, opt, sched)
    _save(ckpt, model, opt, sched, 1)
    return ckpt, model, opt, sched, _snapshot(model)


def _assert_weights(model, expected):
    for n, p in model.named_parameters():
        torch.testing.assert_close(p, expected[n], rtol=0, atol=0)


def test_resumes_the_newest_checkpoint(tmp_path):
    model, opt, sched = _parts(0)
    ckpt = tmp_path / "checkpoint"
    _step(model, opt, sched)
    _save(ckpt, model, opt, sched, 1)
    _step(model, opt, sched)
    _save(ckpt, model, opt, sched, 2)
    saved = _snapshot(model)
    fresh, fopt, fsched = _parts(1)
    src = Position()
    position, history = load_checkpoint(ckpt, fresh, fopt, fsched, src, "run-a")
    assert position == (0, 2) and len(history) == 2 and src.value == 2
    _assert_weights(fresh, saved)
    assert not (tmp_path / "checkpoint.old").exists() and not (tmp_path / "checkpoint.tmp").exists()


def test_killed_mid_swap_resumes_the_previous_checkpoint(tmp_path, reliability):
    ckpt, *_, one = _one_checkpoint(tmp_path)
    # the state a kill leaves between `checkpoint -> checkpoint.old` and `.tmp -> checkpoint`,
    # with the new checkpoint only half written
    ckpt.rename(tmp_path / "checkpoint.old")
    (tmp_path / "checkpoint.tmp").mkdir()
    (tmp_path / "checkpoint.tmp" / "trainable.safetensors").write_bytes(b"\0" * 10)
    fresh, fopt, fsched = _parts(1)
    start = time.perf_counter()
    position, _ = load_checkpoint(ckpt, fresh, fopt, fsched, Position(), "run-a")
    assert position == (0, 1)
    _assert_weights(fresh, one)
    reliability("half-written checkpoint (killed mid-swap)", "resumed from the previous complete checkpoint",
                "yes", time.perf_counter() - start)


@pytest.mark.parametrize("damage", ["truncated-weights", "garbage-meta", "missing-tensor", "other-run"])
def test_a_bad_checkpoint_is_skipped_and_changes_nothing(tmp_path, caplog, damage):
    ckpt, *_ = _one_checkpoint(tmp_path)
    weights = ckpt / "trainable.safetensors"
    if damage == "truncated-weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garbage-meta":
        (ckpt / "meta.json").write_text("{not json")
    elif damage == "missing-tensor":
        from safetensors.torch import load_file, save_file

        state = load_file(str(weights))
        state.pop("bias")
        save_file(state, str(weights))
    fresh, fopt, fsched = _parts(1)
    before = _snapshot(fresh)
    run = "run-b" if damage == "other-run" else "run-a"
    assert load_checkpoint(ckpt, fresh, fopt, fsched, Position(), run) == ((0, 0), [])
    _assert_weights(fresh, before)
    assert "checkpoint not used" in caplog.text and "starts from step 0" in caplog.text


def test_full_disk_while_saving_keeps_the_previous_checkpoint(tmp_path, reliability):
    ckpt, model, opt, sched, one = _one_checkpoint(tmp_path)
    _step(model, opt, sched)
    with file_size_limit(64), pytest.raises(OutputError, match="cannot write the checkpoint.*unchanged"):
        _save(ckpt, model, opt, sched, 2)
    assert not (tmp_path / "checkpoint.tmp").exists()
    fresh, fopt, fsched = _parts(1)
    start = time.perf_counter()
    assert load_checkpoint(ckpt, fresh, fopt, fsched, Position(), "run-a")[0] == (0, 1)
    _assert_weights(fresh, one)
    reliability("full disk while saving a checkpoint (file-size limit)",
                "OutputError naming the folder; the previous checkpoint is kept and resumes", "yes",
                time.perf_counter() - start)
