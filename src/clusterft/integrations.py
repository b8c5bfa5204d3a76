"""Train on a clusterft selection from your own Hugging Face `Trainer` script.

    from clusterft.integrations import WeightedTrainer

    trainer = WeightedTrainer(model=model, args=args, train_dataset=train_ds,
                              data_collator=collator, method_dir="artifacts/methods/cluster")
    trainer.train()

`train_dataset[i]` must be line i of the train split the selection was made from (a dict
with `input_ids` and `labels`, prompt tokens masked with -100). Batching follows the plan,
not `per_device_train_batch_size`: at each optimizer step rank r trains exactly the plan's
samples for (epoch, step, r), and a plan step can hold one sample more on some ranks, so
the batch sampler hands the DataLoader whole plan steps and `per_device_train_batch_size`
is ignored. The Trainer must run `plan.epochs` epochs on `plan.world_size` processes with
`gradient_accumulation_steps=1` (checked at construction).

Loss, as in the train stage (runtime.loop): rank loss = (world / B_step) * sum_i w_i l_i, with l_i the
mean response-token loss of sample i and B_step the sample count of the whole global step,
so DDP's gradient average is the weighted mean over the global step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler

from clusterft.core.allocation import AllocationPlan
from clusterft.core.losses import per_sample_loss
from clusterft.io.records import load_plan, read_selection

try:  # transformers is a hard dependency; keep the sampler importable without it anyway
    from transformers import Trainer
except ImportError:  # pragma: no cover
    Trainer = object  # type: ignore[assignment,misc]

WEIGHT_KEY = "weight"


@dataclass
class PlannedSelection:
    """A selection (one entry per selection.jsonl line) and the plan that schedules it."""

    rows: np.ndarray  # [M] int64 line of each selected sample in the train split
    weights: np.ndarray  # [M] float64 loss weight, mean 1
    ids: list[str]  # [M] sample ids
    plan: AllocationPlan  # `index` column = line of selection.jsonl

    @classmethod
    def load(cls, method_dir: str | Path) -> "PlannedSelection":
        """Read <method_dir>/selection.jsonl, plan.npy and plan.json."""
        d = Path(method_dir)
        sel = read_selection(d / "selection.jsonl")
        plan = load_plan(d)
        out = cls(np.asarray(sel["row"], np.int64), np.asarray(sel["weight"], np.float64),
                  [str(i) for i in sel["id"]], plan)
        if len(out.rows) and plan.table[:, 3].max() >= len(out.rows):
            raise ValueError(f"{d}: plan.npy indexes past the {len(out.rows)} lines of selection.jsonl; "
                             "rerun `clusterft allocate` for this selection")
        return out


class PlanSampler(Sampler[int]):
    """Dataset indices one rank trains in one epoch, in plan order (call `set_epoch`).

    `dataset_indices[j]` is the dataset index of selection line j (default: the plan's
    selection lines are dataset indices). `batches()` yields them grouped by plan step.
    """

    def __init__(self, plan: AllocationPlan, rank: int,
                 dataset_indices: Sequence[int] | np.ndarray | None = None, epoch: int = 0) -> None:
        if not 0 <= rank < plan.world_size:
            raise ValueError(f"rank {rank} is outside the plan's world of {plan.world_size}")
        self.plan = plan
        self.rank = rank
        self.dataset_indices = None if dataset_indices is None else np.asarray(dataset_indices, np.int64)
        self._mine = plan.table[plan.table[:, 2] == rank]
        self.set_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        if not 0 <= epoch < self.plan.epochs:
            raise ValueError(f"epoch {epoch} is outside the plan's {self.plan.epochs} epochs "
                             "(train for exactly plan.epochs epochs)")
        self.epoch = epoch

    def batches(self) -> Iterator[list[int]]:
        """One list of dataset indices per plan step of the current epoch."""
        te = self._mine[self._mine[:, 0] == self.epoch]  # sorted by step, then index
        bounds = np.searchsorted(te[:, 1], np.arange(self.plan.steps_per_epoch + 1))
        for s in range(self.plan.steps_per_epoch):
            idx = te[bounds[s]: bounds[s + 1], 3]
            if self.dataset_indices is not None:
                idx = self.dataset_indices[idx]
            yield idx.tolist()

    def __iter__(self) -> Iterator[int]:
        for batch in self.batches():
            yield from batch

    def __len__(self) -> int:
        return int((self._mine[:, 0] == self.epoch).sum())


class PlanBatchSampler(Sampler[list[int]]):
    """`DataLoader(batch_sampler=...)` form of a PlanSampler: one batch per plan step."""

    def __init__(self, sampler: PlanSampler) -> None:
        self.sampler = sampler

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        return self.sampler.batches()

    def __len__(self) -> int:
        return self.sampler.plan.steps_per_epoch


def plan_weighted_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(world / B_step) * sum_i w_i l_i over this rank's batch; B_step summed over ranks.

    logits [B, T, V], labels [B, T] (unshifted, -100 = ignored), weights [B]. With one
    process this is the weighted mean sum_i w_i l_i / B."""
    losses = per_sample_loss(logits, labels)
    n = torch.tensor(float(len(losses)), device=losses.device)
    world = 1
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(n)  # every rank computes one loss per step, so this cannot deadlock
        world = dist.get_world_size()
    return world * (weights.to(losses.dtype) * losses).sum() / n


class _WithWeights(Dataset):
    """Adds the selection weight of each dataset item as a `weight` field."""

    def __init__(self, dataset: Any, weight_of: dict[int, float]) -> None:
        self.dataset, self.weight_of = dataset, weight_of

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict:
        item = self.dataset[i]
        if not isinstance(item, dict):
            raise TypeError(f"train_dataset[{i}] is a {type(item).__name__}; WeightedTrainer needs dict items")
        return {**item, WEIGHT_KEY: self.weight_of[int(i)]}


class _WeightCollator:
    """Collates with the user's collator, passing the weights around it as a tensor."""

    def __init__(self, collator: Callable[[list[dict]], dict]) -> None:
        self.collator = collator

    def __call__(self, features: list[dict]) -> dict:
        weights = torch.tensor([f[WEIGHT_KEY] for f in features], dtype=torch.float32)
        batch = self.collator([{k: v for k, v in f.items() if k != WEIGHT_KEY} for f in features])
        batch[WEIGHT_KEY] = weights
        return batch


class _PlanDataLoader(DataLoader):
    """A DataLoader the Trainer can `set_epoch`; not sharded again by accelerate."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


class WeightedTrainer(Trainer):
    """`transformers.Trainer` that trains a clusterft selection: plan order, weighted loss.

    Pass `method_dir` (artifacts/methods/<m>) or a loaded `selection`; `dataset_indices`
    maps selection lines to dataset indices when `train_dataset` is not the train split
    in file order (default: the selection's `row` column)."""

    loss_is_scaled_for_ga = True  # normalised per plan step; gradient accumulation is refused

    def __init__(self, *args: Any, method_dir: str | Path | None = None,
                 selection: PlannedSelection | None = None,
                 dataset_indices: Sequence[int] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if (method_dir is None) == (selection is None):
            raise ValueError("pass exactly one of method_dir= or selection=")
        self.selection = selection or PlannedSelection.load(method_dir)
        idx = self.selection.rows if dataset_indices is None else np.asarray(dataset_indices, np.int64)
        if len(idx) != len(self.selection.rows):
            raise ValueError(f"dataset_indices has {len(idx)} entries for {len(self.selection.rows)} selected samples")
        self.dataset_indices = idx
        self._check_args()

    def _check_args(self) -> None:
        a, plan = self.args, self.selection.plan
        problems = []
        if a.gradient_accumulation_steps != 1:
            problems.append(f"gradient_accumulation_steps={a.gradient_accumulation_steps} (must be 1: "
                            "a plan step is one optimizer step)")
        if a.max_steps > 0:
            problems.append(f"max_steps={a.max_steps} (leave unset: the plan fixes the steps)")
        if a.num_train_epochs != plan.epochs:
            problems.append(f"num_train_epochs={a.num_train_epochs} but the plan has {plan.epochs} epochs")
        if a.world_size != plan.world_size:
            problems.append(f"{a.world_size} processes but the plan is for {plan.world_size}; "
                            f"launch with torchrun --nproc_per_node={plan.world_size}")
        if self.train_dataset is not None and len(self.dataset_indices) and \
                self.dataset_indices.max() >= len(self.train_dataset):
            problems.append(f"the selection uses dataset index {int(self.dataset_indices.max())} but "
                            f"train_dataset has {len(self.train_dataset)} items")
        if problems:
            raise ValueError("WeightedTrainer: " + "; ".join(problems))

    def get_train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            raise ValueError("WeightedTrainer: training requires a train_dataset")
        sampler = PlanSampler(self.selection.plan, self.args.process_index, self.dataset_indices)
        weight_of = {int(i): float(w) for i, w in zip(self.dataset_indices, self.selection.weights)}
        collator = self.data_collator
        # Keep the Trainer's column pruning (remove_unused_columns) for the user's fields.
        if hasattr(self, "_get_collator_with_removed_columns"):
            collator = self._get_collator_with_removed_columns(collator, description="training")
        # Not passed through accelerator.prepare: that would shard the already per-rank
        # batches again. training_step moves each batch to args.device itself.
        return _PlanDataLoader(
            _WithWeights(self.train_dataset, weight_of),
            batch_sampler=PlanBatchSampler(sampler),
            collate_fn=_WeightCollator(collator),
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )

    def num_examples(self, dataloader: DataLoader) -> int:
        """Samples per epoch (the selection, not the whole train split) for logs and speeds."""
        if isinstance(dataloader, _PlanDataLoader):
            return len(self.selection.rows)
        return super().num_examples(dataloader)

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        """Plan-weighted loss in training; the (weighted) mean per-sample loss in evaluation."""
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        weights = inputs.pop(WEIGHT_KEY, None)
        outputs = model(**inputs)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        if weights is None:
            weights = torch.ones(len(labels), device=logits.device)
        if model.training:
            loss = plan_weighted_loss(logits, labels, weights)
        else:
            loss = (weights * per_sample_loss(logits, labels)).mean()
        return (loss, outputs) if return_outputs else loss
