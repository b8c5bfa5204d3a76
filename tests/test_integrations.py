"""clusterft inside a user's own HF Trainer: plan-following sampler and weighted loss."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import TrainingArguments

from clusterft.core.allocation import AllocationPlan, build_plan
from clusterft.core.tokens import IGNORE_INDEX, Encoded, collate
from clusterft.integrations import (
    PlanBatchSampler,
    PlannedSelection,
    PlanSampler,
    WeightedTrainer,
)
from tests.conftest import REPO, tiny_params, write_params
from tests.helpers.grad_case import case_samples


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "hf"), num_train_epochs=1, report_to="none", use_cpu=True,
                save_strategy="no", disable_tqdm=True)
    return TrainingArguments(**{**base, **kw})


def _collate_dicts(features):
    return collate([Encoded(str(i), f["input_ids"], f["labels"]) for i, f in enumerate(features)], 0)


def test_plan_sampler_yields_each_ranks_plan_steps_in_order_per_epoch():
    clusters = np.repeat([0, 1, 2], [7, 5, 3])  # 15 samples, 2 steps of 8 and 7: uneven ranks
    plan = build_plan(clusters, world_size=2, per_device_batch=3, epochs=2, seed=1)
    to_dataset = 100 + 3 * np.arange(15)  # selection line j is dataset item 100 + 3j
    for epoch in range(plan.epochs):
        seen = []
        for rank in range(2):
            sampler = PlanSampler(plan, rank, to_dataset)
            sampler.set_epoch(epoch)
            want = [to_dataset[idx].tolist() for e, _, idx in plan.rank_batches(rank) if e == epoch]
            assert list(sampler.batches()) == want
            assert list(sampler) == [i for b in want for i in b] and len(sampler) == sum(map(len, want))
            batch_sampler = PlanBatchSampler(sampler)
            assert len(batch_sampler) == plan.steps_per_epoch and list(batch_sampler) == want
            seen += list(sampler)
        assert sorted(seen) == to_dataset.tolist()  # every selected sample once per epoch
    assert {len(b) for r in range(2) for b in PlanSampler(plan, r).batches()} == {3, 4}
    with pytest.raises(ValueError, match="epoch 2"):
        PlanSampler(plan, 0).set_epoch(2)
    with pytest.raises(ValueError, match="rank 2"):
        PlanSampler(plan, 2)


def _one_step_selection(weights):
    n = len(weights)
    table = np.array([[0, 0, 0, i] for i in range(n)], dtype=np.int64)
    return PlannedSelection(np.arange(n), np.asarray(weights, float), [str(i) for i in range(n)],
                            AllocationPlan(table, 1, 1, 1))


def test_weighted_trainer_loss_is_weighted_mean_of_response_token_losses(tiny_model_dir, tmp_path):
    from clusterft.runtime.model import load_model

    samples = case_samples()  # 4 samples of lengths 5, 3, 6, 4; 2 prompt tokens each
    weights = [0.5, 2.0, 1.0, 0.5]
    train_ds = [{"input_ids": s.input_ids, "labels": s.labels} for s in samples]
    trainer = WeightedTrainer(model=load_model(tiny_model_dir), args=_args(tmp_path), train_dataset=train_ds,
                              data_collator=_collate_dicts, selection=_one_step_selection(weights))
    loader = trainer.get_train_dataloader()
    assert len(loader) == 1
    (batch,) = list(loader)
    torch.testing.assert_close(batch["weight"], torch.tensor(weights))
    model = trainer.model.train()
    loss = trainer.compute_loss(model, batch)

    expected = 0.0  # each sample alone, no padding: mean CE of its response tokens
    with torch.no_grad():
        for s, w in zip(samples, weights):
            logits = model(input_ids=torch.tensor([s.input_ids])).logits[0, :-1]
            target = torch.tensor(s.labels[1:])
            keep = target != IGNORE_INDEX
            expected += w * torch.nn.functional.cross_entropy(logits[keep], target[keep]) / len(samples)
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-6)
    loss.backward()  # a real, differentiable loss
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0
    eval_loss, outputs = trainer.compute_loss(model.eval(), batch, return_outputs=True)  # Trainer.evaluate
    torch.testing.assert_close(eval_loss.detach(), expected, rtol=1e-5, atol=1e-6)
    assert outputs.logits.shape[:2] == batch["input_ids"].shape


def test_weighted_trainer_refuses_arguments_that_would_leave_the_plan(tiny_model_dir, tmp_path):
    from clusterft.runtime.model import load_model

    model = load_model(tiny_model_dir)
    train_ds = [{"input_ids": s.input_ids, "labels": s.labels} for s in case_samples()]
    sel = _one_step_selection([1.0] * 4)
    for kw, msg in [({"gradient_accumulation_steps": 2}, "gradient_accumulation_steps=2"),
                    ({"num_train_epochs": 3}, "plan has 1 epochs"), ({"max_steps": 5}, "max_steps=5")]:
        with pytest.raises(ValueError, match=msg):
            WeightedTrainer(model=model, args=_args(tmp_path, **kw), train_dataset=train_ds,
                            data_collator=_collate_dicts, selection=sel)
    with pytest.raises(ValueError, match="dataset index 3"):
        WeightedTrainer(model=model, args=_args(tmp_path), train_dataset=train_ds[:3],
                        data_collator=_collate_dicts, selection=sel)


def test_real_hf_trainer_on_two_gloo_ranks_trains_exactly_the_plan(tmp_path):
    """torchrun x2 running a user-style Trainer script: each rank's loss saw exactly its plan
    steps (rows and weights, in order, uneven per-rank sizes included) and the loss fell."""
    from clusterft.core.selection import Selection
    from clusterft.io.records import save_plan, write_selection
    from clusterft.orchestration.launch import stage_functions
    from clusterft.runtime.data import load_examples
    from clusterft.spec.config import load_config

    params = write_params(tmp_path, tiny_params(tmp_path))
    cfg = load_config(params)
    fns = stage_functions()
    fns["make-benchmark"](cfg)
    fns["prepare-model"](cfg)
    ids = [e.id for e in load_examples(cfg, "train")]
    rows = np.sort(np.random.default_rng(0).choice(len(ids), size=60, replace=False))
    clusters = rows % 3
    weights = np.where(clusters == 0, 2.0, 0.5)
    weights = weights / weights.mean()
    mdir = tmp_path / "methods" / "pick"
    write_selection(mdir / "selection.jsonl", Selection(rows, clusters, weights), ids)
    plan = build_plan(clusters, world_size=2, per_device_batch=4, epochs=3, seed=0)  # 7 steps of 9 or 8
    save_plan(mdir, plan)

    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "tests/helpers/hf_trainer_plan.py"), str(params), str(mdir), str(out)]
    res = subprocess.run(cmd, env=env, cwd=tmp_path, timeout=300, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    S = plan.steps_per_epoch
    sizes = set()
    for rank in range(2):
        consumed = json.loads((out / f"consumed_rank{rank}.json").read_text())
        want = list(plan.rank_batches(rank))
        assert [c["global_step"] for c in consumed] == list(range(plan.epochs * S))
        for c, (e, s, idx) in zip(consumed, want, strict=True):
            assert c["global_step"] == e * S + s
            assert c["rows"] == rows[idx].tolist()
            np.testing.assert_allclose(c["weights"], weights[idx], rtol=1e-6)
            sizes.add(len(idx))
    assert sizes == {4, 5}
    losses = [h["loss"] for h in json.loads((out / "log_history.json").read_text()) if "loss" in h]
    assert len(losses) == plan.epochs * S
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.3, losses
