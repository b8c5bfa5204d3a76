"""The training loop's step options: micro-batches (grad_accum, micro_batch_tokens) and the
fast loss give the same update as the whole step over full logits; bf16 / fp16 autocast train a real tiny model end to end."""

import logging
import time

import numpy as np
import pytest
import torch

from clusterft.core.allocation import build_plan
from clusterft.runtime.loop import make_optimizer, micro_batches, train_on_plan
from clusterft.runtime.model import load_model
from clusterft.spec.config import TrainConfig
from tests.helpers.grad_case import case_samples


def test_micro_batches_cover_the_step_in_order_under_the_token_cap():
    lengths = np.array([5, 3, 6, 4, 9, 2, 7])
    for parts, cap in [(1, 0), (2, 0), (3, 12), (1, 10), (7, 0), (20, 0), (1, 1)]:
        mbs = micro_batches(len(lengths), lengths, parts, cap)
        assert np.concatenate(mbs).tolist() == list(range(len(lengths)))
        assert len(mbs) >= min(parts, len(lengths))
        for mb in mbs:
            assert len(mb) == 1 or not cap or len(mb) * lengths[mb].max() <= cap


def _train(model_dir, checkpointing=False, optimizer="adamw", system=(), **options):
    torch.manual_seed(0)
    model = load_model(model_dir)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = make_optimizer(optimizer, list(model.parameters()), 1e-2, 0.0)
    samples = case_samples(system) * 4
    plan = build_plan(np.full(len(samples), -1), 1, 8, 2, 0, "shuffle")
    history = train_on_plan(model, samples, np.linspace(0.5, 2.0, len(samples)), plan,
                            TrainConfig(lr=1e-2, **{"log_every": 100, **options}), optimizer=opt)
    return {n: p.detach().clone() for n, p in model.named_parameters()}, history


@pytest.mark.parametrize("options", [{"grad_accum": 3}, {"grad_accum": 8}, {"micro_batch_tokens": 12}])
def test_micro_batches_give_the_same_update_as_the_whole_step(tiny_model_dir, options):
    whole, h1 = _train(tiny_model_dir)
    split, h2 = _train(tiny_model_dir, **options)
    for n in whole:
        torch.testing.assert_close(split[n], whole[n], rtol=1e-4, atol=1e-5, msg=n)
    assert [h["tokens"] for h in h1] == [h["tokens"] for h in h2]
    assert [h["weighted_loss"] for h in h1] == pytest.approx([h["weighted_loss"] for h in h2], rel=1e-5)


@pytest.mark.parametrize("checkpointing", [False, True])  # recomputed layers: the prompt runs in every row
def test_the_fast_loss_gives_the_update_of_full_logits_over_whole_rows(tiny_model_dir, checkpointing):
    full, h1 = _train(tiny_model_dir, checkpointing, system=(1, 2, 3), fast_loss=False)
    fast, h2 = _train(tiny_model_dir, checkpointing, system=(1, 2, 3))
    for n in full:  # AdamW turns float-rounding gradient differences into up to ~1e-5 (a step is 1e-2)
        torch.testing.assert_close(fast[n], full[n], rtol=1e-4, atol=1e-4, msg=n)
    assert [h["weighted_loss"] for h in h1] == pytest.approx([h["weighted_loss"] for h in h2], rel=1e-5)
    assert {h["loss_path"] for h in h1} == {"full logits"}
    assert {h["loss_path"] for h in h2} == {"answer positions" if checkpointing else "answer positions, shared prefix"}


def test_activation_checkpointing_gives_the_same_update(tiny_model_dir):
    plain, h1 = _train(tiny_model_dir)
    recomputed, h2 = _train(tiny_model_dir, checkpointing=True)
    for n in plain:
        torch.testing.assert_close(recomputed[n], plain[n], rtol=1e-4, atol=1e-5, msg=n)
    for h in h1 + h2:
        assert h["tokens_per_s"] > 0 and h["peak_mem_mb"] > 0


def test_adafactor_trains(tiny_model_dir):
    start = {n: p.detach().clone() for n, p in load_model(tiny_model_dir).named_parameters()}
    trained, h = _train(tiny_model_dir, optimizer="adafactor")
    assert all(np.isfinite(r["weighted_loss"]) for r in h)
    assert any(not torch.equal(trained[n], start[n]) for n in start)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_trains_the_tiny_model(tiny_model_dir, precision):
    start = {n: p.detach().clone() for n, p in load_model(tiny_model_dir).named_parameters()}
    fp32, h32 = _train(tiny_model_dir)
    half, h = _train(tiny_model_dir, precision=precision)
    assert all(np.isfinite(r["weighted_loss"]) for r in h)
    moved = sum(float((half[n] - start[n]).abs().sum()) for n in start)
    assert moved > 0 and all(half[n].dtype == torch.float32 for n in half)  # fp32 master weights
    assert h[0]["weighted_loss"] == pytest.approx(h32[0]["weighted_loss"], rel=0.05)  # same model, rounder


class Crash(Exception):
    pass


def test_the_training_clock_goes_on_over_a_resume_and_leaves_out_evaluation(tiny_model_dir, tmp_path):
    """A run killed after its checkpoint at step 4 resumes there with the clock it had: its
    records' `clock_s` never go back, and the seconds a hook says it spent evaluating are
    left out while other hook time (live tracking) counts."""
    samples = case_samples() * 4
    plan = build_plan(np.full(len(samples), -1), 1, 2, 2, 0, "shuffle")  # 16 steps
    t = TrainConfig(lr=1e-2, log_every=100, checkpoint_every=4)

    def run(hook):
        torch.manual_seed(0)
        return train_on_plan(load_model(tiny_model_dir), samples, np.ones(len(samples)), plan, t,
                             checkpoint_dir=tmp_path / "ckpt", on_step=hook)

    first = []

    def until_crash(g, rec):
        first.append(rec)  # the record as the loop keeps it (its clock is set again after the hook)
        if g == 2:
            time.sleep(1.0)
            return 1.0  # an evaluation: off the clock
        if g == 3:
            time.sleep(1.0)  # live tracking: on the clock
        if g == 5:
            raise Crash

    with pytest.raises(Crash):
        run(until_crash)
    history = run(lambda g, rec: None)
    assert len(history) == plan.total_steps > 5
    clocks = [h["clock_s"] for h in history]
    assert clocks[:4] == [h["clock_s"] for h in first[:4]]  # restored from the checkpoint
    assert all(b > a for a, b in zip(clocks, clocks[1:]))  # one clock over both attempts
    assert clocks[1] - clocks[0] < 1.0 <= clocks[2] - clocks[1]  # steps 2 and 3, each with its hook


@pytest.mark.parametrize("every", [1, 3])
def test_progress_lines_come_every_log_every_steps_and_at_the_end(tiny_model_dir, caplog, every):
    with caplog.at_level(logging.INFO, logger="clusterft.runtime.loop"):
        _, history = _train(tiny_model_dir, log_every=every)
    steps = [int(m.split()[3].split("/")[0]) for m in caplog.messages if m.startswith("epoch ")]
    n = len(history)
    assert steps == sorted({*range(1, n + 1, every), n})
