"""The weighted data-parallel training loop that follows an allocation plan.

Each step, rank r trains the plan's samples for (epoch, step, r). Its loss is
(world / B_step) * sum_i w_i * l_i, with l_i the mean response-token loss of sample i and
B_step the number of samples in the whole global step, so the gradient average equals the
weighted mean over the global step even when ranks hold different sample counts.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from clusterft.core.allocation import AllocationPlan
from clusterft.core.losses import TrainLoss
from clusterft.core.tokens import Encoded, collate, shared_prefix
from clusterft.runtime import parallel
from clusterft.runtime.checkpoint import load_checkpoint, run_digest, save_checkpoint
from clusterft.runtime.distributed import DistInfo, gather_objects
from clusterft.runtime.precision import autocast, peak_memory_mb
from clusterft.spec.config import TrainConfig

log = logging.getLogger(__name__)
SINGLE = DistInfo(0, 1, 0, torch.device("cpu"), None)  # a world of one on the CPU


def make_optimizer(name: str, params: list, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW, or Adafactor (factored second moments: far less optimizer memory, as in the paper)."""
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def micro_batches(n: int, lengths: np.ndarray, parts: int, max_tokens: int) -> list[np.ndarray]:
    """Positions 0..n-1 of one rank's share of a step, cut into micro-batches: `parts` near-equal
    slices, each cut further until its padded size (count x longest) is at most `max_tokens`
    (0 = no cap; a single sample is never cut). The loss is a weighted sum over samples, so the
    summed gradients of the micro-batches equal the whole step's."""
    out: list[np.ndarray] = []
    todo = [s for s in np.array_split(np.arange(n), max(1, min(parts, n))) if len(s)]
    while todo:
        s = todo.pop(0)
        if max_tokens and len(s) > 1 and len(s) * int(lengths[s].max()) > max_tokens:
            half = len(s) // 2
            todo[:0] = [s[:half], s[half:]]
        else:
            out.append(s)
    return out


def cosine_schedule(optimizer: torch.optim.Optimizer, total_steps: int, warmup_ratio: float):
    """Linear warmup then cosine decay to 10% of the peak learning rate."""
    warm = max(1, int(round(warmup_ratio * total_steps)))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, total_steps - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class PlanSource:
    """A static allocation plan seen as a batch source for one rank (rescale is 1)."""

    needs_losses = False

    def __init__(self, plan: AllocationPlan, rank: int):
        self.plan, self.rank = plan, rank
        self.total_steps = plan.total_steps
        self._sizes = plan.step_sizes()

    def batches(self, start_epoch: int = 0, resumed: bool = False):
        for e, s, idx in self.plan.rank_batches(self.rank):
            if e >= start_epoch:
                yield e, s, idx, int(self._sizes[e, s]), np.ones(len(idx))

    def observe(self, idx: np.ndarray, losses: np.ndarray) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def plan_stub(source: Any) -> AllocationPlan:
    """Identity stand-in for a dynamic source (its seed and shape define its batches)."""
    return AllocationPlan(np.array([[source.n, source.world, source.batch, source.epochs, source.seed]]),
                          source.world, source.epochs, 0)


@dataclass
class _Run:
    """One rank's training state: what the steps share."""

    model: Any
    encoded: list[Encoded]
    weights: torch.Tensor  # [n] every selected sample's weight
    source: Any
    t: TrainConfig
    info: DistInfo
    pad_id: int
    opt: torch.optim.Optimizer
    params: list
    loss: TrainLoss
    sched: Any = None
    scaler: Any = None
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def sharded(self) -> bool:
        return parallel.is_sharded(self.model)

    def passes(self, idx: np.ndarray) -> list:
        """This rank's micro-batches of a step, padded with zero-weight passes (None) so that
        every rank syncs (a rank without samples) and, under FSDP, runs as many passes."""
        device, distributed = self.info.device, self.info.world_size > 1
        mbs: list = micro_batches(len(idx), self.lengths[idx], self.t.grad_accum, self.t.micro_batch_tokens)
        passes = max(len(mbs), 1) if distributed else len(mbs)  # a rank without samples still syncs
        if self.sharded and distributed:  # FSDP gathers every layer in every pass: same count on every rank
            count = torch.tensor([passes], device=device)
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            passes = int(count.item())
        return mbs + [None] * (passes - len(mbs))

    def backward(self, idx: np.ndarray, w: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Forward and backward of every micro-batch of a step: (per-sample losses, this rank's
        scaled loss sum, real tokens)."""
        device = self.info.device
        parts, loss_sum, tokens = [], torch.zeros((), device=device), 0
        mbs = self.passes(idx)
        for k, mb in enumerate(mbs):
            rows, w_mb = (idx[mb], w[torch.as_tensor(mb)]) if mb is not None else \
                ([0], torch.zeros(1, device=device))
            batch = {k2: v.to(device) for k2, v in collate([self.encoded[i] for i in rows], self.pad_id).items()}
            self.loss.check(batch)  # each path once, in fp32
            with parallel.gradient_sync(self.model, k == len(mbs) - 1):
                with autocast(self.t.precision, device):
                    loss, mb_losses = self.loss(batch, w_mb, scale)
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            if mb is not None:
                parts.append(mb_losses.float())
                tokens += int(batch["attention_mask"].sum())
            loss_sum = loss_sum + loss.detach().float()
        losses = torch.cat(parts) if parts else torch.zeros(0, device=device)
        return losses, loss_sum, tokens

    def sync_losses(self, idx: np.ndarray, losses: torch.Tensor, loss_sum: torch.Tensor, scale: float) -> torch.Tensor:
        """All-reduce this rank's sum of w_i l_i (and, for a source that learns from losses,
        every sample's loss); returns the reduced vector (its first entry: the step's sum)."""
        n = len(self.weights)
        extras = [loss_sum.reshape(1) / scale]
        if self.source.needs_losses:
            seen = torch.zeros(2 * n)
            seen[torch.as_tensor(idx)] = losses.cpu()
            seen[n + torch.as_tensor(idx)] = 1.0
            extras.append(seen.to(self.info.device))
        extra = torch.cat(extras)
        if self.info.world_size > 1:  # waits for the slowest rank: the rest of the exposed sync
            dist.all_reduce(extra)
        if self.source.needs_losses:
            got = extra[1:].cpu().numpy()
            mask = got[n:] > 0
            self.source.observe(np.flatnonzero(mask), got[:n][mask])
        return extra

    def update(self) -> None:
        """Clip and apply the reduced gradients (fp16: unscaled first, a step skipped on overflow)."""
        if self.scaler is not None:
            self.scaler.unscale_(self.opt)  # every rank holds the same reduced gradients: same skip decision
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        self.sched.step()

    def step(self, g: int, epoch: int, idx: np.ndarray, step_size: int, rescale: Any) -> dict:
        """One optimizer step over the plan's samples `idx` of this rank; its record."""
        ts = time.perf_counter()
        idx = np.asarray(idx)
        scale = self.info.world_size / float(step_size)
        w = (self.weights[idx] * torch.as_tensor(rescale, dtype=torch.float32)).to(self.info.device)
        self.opt.zero_grad(set_to_none=True)
        parallel.last_bucket_time(self.model, reset=True)
        losses, loss_sum, tokens = self.backward(idx, w, scale)
        compute_s = (parallel.last_bucket_time(self.model) or time.perf_counter()) - ts
        extra = self.sync_losses(idx, losses, loss_sum, scale)
        sync_s = time.perf_counter() - ts - compute_s
        self.update()
        return {
            "step": g, "epoch": epoch, **({"loss": float(losses.mean())} if len(losses) else {}),  # none: no sample
            "weighted_loss": float(extra[0]) / float(step_size),
            "lr": self.sched.get_last_lr()[0], "samples": int(len(idx)), "loss_path": self.loss.path(),
            "tokens": tokens, "compute_s": compute_s, "sync_s": sync_s,
            "step_s": time.perf_counter() - ts, "tokens_per_s": tokens / max(1e-9, compute_s),
            "peak_mem_mb": peak_memory_mb(self.info.device),
            "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            "time": time.time(),  # wall clock (the MLflow curve's timestamps)
            "pid": os.getpid(),  # a resumed run's log holds the steps of more than one process
        }


def train_on_plan(model: Any, encoded: list[Encoded], weights: np.ndarray, plan: AllocationPlan | Any,
                  t: TrainConfig, info: DistInfo = SINGLE, pad_id: int = 0, *,
                  optimizer: torch.optim.Optimizer | None = None, checkpoint_dir: Path | None = None,
                  on_step: Callable[[int, dict], None] | None = None) -> list[dict]:
    """Train this rank's share of a plan (or of a dynamic source such as InfoBatch) with the
    settings of `t` (lr, schedule, optimizer, precision, micro-batches, checkpoints, logging);
    return step records (loss, times).

    `model` is wrapped by `parallel.wrap` (DDP or FSDP2) when there are several ranks: the
    gradient reduction overlaps the backward, and each step's compute and exposed sync time
    (communication left over plus waiting for the slowest rank) are still measured apart.
    Pass `optimizer` to keep its state afterwards (default: t.optimizer on the trainable
    weights). With `checkpoint_dir`, rank 0 (every rank under FSDP: sharded) checkpoints
    every t.checkpoint_every steps and every rank resumes from the last checkpoint.
    `on_step(g, record)` is called after optimizer step g (1-based): snapshots, live tracking;
    the seconds it returns (an evaluation) are kept off the clock. Each record's `clock_s` is
    the run's training seconds so far, carried over a resume (a crash costs only the steps
    redone since the checkpoint)."""
    t0 = time.perf_counter()
    source = plan if hasattr(plan, "batches") else PlanSource(plan, info.rank)
    params = [p for p in model.parameters() if p.requires_grad]
    module = parallel.unwrap(model)
    loss = TrainLoss(model, module, shared_prefix(encoded), t.fast_loss, share_prefix=not parallel.is_sharded(
        model) and not getattr(module, "is_activation_checkpointing", False))  # a layer run twice: no shared cache
    run = _Run(model, encoded, torch.tensor(weights, dtype=torch.float32), source, t, info, pad_id,
               optimizer or make_optimizer(t.optimizer, params, t.lr, t.weight_decay), params, loss,
               lengths=np.array([e.n_tokens for e in encoded]))
    run.sched = cosine_schedule(run.opt, source.total_steps, t.warmup_ratio)
    run.scaler = parallel.grad_scaler(t.precision, info.device, model)
    digest = run_digest(getattr(source, "plan", None) or plan_stub(source), weights, t.lr, t.warmup_ratio,
                        t.weight_decay, t.precision, type(run.opt).__name__,
                        "fsdp" if run.sharded else "replicated", getattr(source, "identity", ""))
    position, history = (0, 0), []  # (epoch, step in epoch) to resume at
    if checkpoint_dir is not None:
        position, history = load_checkpoint(checkpoint_dir, model, run.opt, run.sched, source, digest,
                                            run.scaler, run.sharded)
    model.train()
    off_clock = -(history[-1].get("clock_s", 0.0) if history else 0.0)  # a resumed run's clock goes on
    for epoch, step, idx, step_size, rescale in source.batches(position[0], resumed=bool(history)):
        if epoch == position[0] and step < position[1]:
            continue
        rec = run.step(len(history), epoch, idx, step_size, rescale)
        history.append(rec)
        g = len(history)
        rec["clock_s"] = time.perf_counter() - t0 - off_clock
        if on_step is not None:
            off_clock += on_step(g, rec) or 0.0
            rec["clock_s"] = time.perf_counter() - t0 - off_clock
        every = t.checkpoint_every
        if checkpoint_dir is not None and every and g % every == 0 and (info.rank == 0 or run.sharded):
            t_save = time.perf_counter()
            save_checkpoint(checkpoint_dir, model, run.opt, run.sched, source, (epoch, step + 1), digest, history,
                            run.scaler, run.sharded, info.rank)
            rec["checkpoint_s"] = time.perf_counter() - t_save  # what a save costs (the time-budget model)
        if info.rank == 0 and ((g - 1) % t.log_every == 0 or g == source.total_steps):
            log.info("epoch %d step %d/%d loss %.4f lr %.2e %.0f ms/step", epoch, g, source.total_steps,
                     rec["weighted_loss"], rec["lr"], 1000 * rec["clock_s"] / g)
    return history


def gather_rank_timings(history: list[dict]) -> list[dict]:
    """Per step, every rank's compute/sync seconds and tokens (lists indexed by rank)."""
    ranks = gather_objects([(h["compute_s"], h["sync_s"], h["tokens"]) for h in history])
    return [
        {"rank_compute_s": [r[i][0] for r in ranks], "rank_sync_s": [r[i][1] for r in ranks],
         "rank_tokens": [r[i][2] for r in ranks]}
        for i in range(len(history))
    ]


def wait_summary(history: list[dict]) -> dict[str, float]:
    """Totals over the run: compute and sync seconds per rank, and the straggler cost
    (sum over steps of the slowest rank's compute minus the mean rank's compute)."""
    comp = np.array([h["rank_compute_s"] for h in history])
    sync = np.array([h["rank_sync_s"] for h in history])
    tokens = np.array([h["rank_tokens"] for h in history], dtype=float)
    return {
        "compute_s_per_rank": comp.sum(0).round(3).tolist(),
        "sync_s_per_rank": sync.sum(0).round(3).tolist(),
        "sync_fraction": float(sync.sum() / max(1e-9, comp.sum() + sync.sum())),
        "straggler_s": float((comp.max(1) - comp.mean(1)).sum()),
        "token_imbalance_mean": float((tokens.max(1) / np.maximum(1, tokens.mean(1))).mean()),
    }
