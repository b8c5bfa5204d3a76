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
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterft import parallel
from clusterft.allocation import AllocationPlan
from clusterft.checkpoint import load_checkpoint, run_digest, save_checkpoint
from clusterft.data import Encoded, collate, per_sample_loss

log = logging.getLogger(__name__)


def weighted_loss(model: Any, batch: dict[str, torch.Tensor], weights: torch.Tensor,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale * sum_i w_i l_i, per-sample losses l [B])."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    losses = per_sample_loss(out.logits, batch["labels"])
    return scale * (weights * losses).sum(), losses.detach()


PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision: str, device: torch.device) -> Any:
    """Mixed-precision context for forward passes: fp32 weights stay the master copy (AdamW
    updates them); bf16 / fp16 run the matmuls in half precision where the device supports it."""
    from contextlib import nullcontext

    dtype = PRECISIONS[precision]
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this rank so far: allocated CUDA memory on a GPU, the process's peak
    resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


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
        self.total_steps = plan.epochs * plan.steps_per_epoch
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


def train_on_plan(
    model: Any,
    encoded: list[Encoded],
    weights: np.ndarray,
    plan: AllocationPlan | Any,
    rank: int,
    pad_id: int,
    lr: float,
    warmup_ratio: float = 0.05,
    weight_decay: float = 0.0,
    log_every: int = 20,
    device: torch.device | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    checkpoint_dir: Path | None = None,
    checkpoint_every: int = 0,
    world_size: int | None = None,
    on_step: Any = None,
    precision: str = "fp32",
    grad_accum: int = 1,
    micro_batch_tokens: int = 0,
    optimizer_name: str = "adamw",
) -> list[dict]:
    """Train this rank's share of a plan (or of a dynamic source such as InfoBatch);
    return step records (loss, times).

    `model` is wrapped by `parallel.wrap` (DDP or FSDP2) when there are several ranks: the
    gradient reduction overlaps the backward, and each step's compute and exposed sync time
    (communication left over plus waiting for the slowest rank) are still measured apart.
    Pass `optimizer` to keep its state afterwards (default: `optimizer_name` on the trainable
    weights). With `checkpoint_dir`, rank 0 (every rank under FSDP: sharded) checkpoints
    every `checkpoint_every` steps and every rank resumes from the last checkpoint.
    `on_step(g, record)` is called after optimizer step g (1-based): snapshots, live tracking.
    `precision` bf16/fp16 autocasts the forward (fp16 with loss scaling); `grad_accum` and
    `micro_batch_tokens` cut each rank's share of a step into micro-batches (see
    micro_batches), whose gradients add up to the whole step's before the one sync."""
    import torch.distributed as dist

    source = plan if hasattr(plan, "batches") else PlanSource(plan, rank)
    world = world_size or plan.world_size
    device = device or torch.device("cpu")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer or make_optimizer(optimizer_name, params, lr, weight_decay)
    sharded = parallel.is_sharded(model)
    total = source.total_steps
    sched = cosine_schedule(opt, total, warmup_ratio)
    w_all = torch.tensor(weights, dtype=torch.float32)
    lengths = np.array([e.n_tokens for e in encoded])  # micro_batches' token cap
    n = len(weights)
    distributed = world > 1
    history: list[dict] = []
    position = (0, 0)  # (epoch, step in epoch) to resume at
    scaler = parallel.grad_scaler(precision, device, model)
    digest = run_digest(getattr(source, "plan", None) or plan_stub(source), weights, lr, warmup_ratio,
                        weight_decay, precision, type(opt).__name__, "fsdp" if sharded else "replicated",
                        getattr(source, "identity", ""))
    if checkpoint_dir is not None:
        position, history = load_checkpoint(checkpoint_dir, model, opt, sched, source, digest, scaler, sharded)
    model.train()
    t0 = time.perf_counter()
    g = len(history)
    for epoch, step, idx, step_size, rescale in source.batches(position[0], resumed=bool(history)):
        if epoch == position[0] and step < position[1]:
            continue
        ts = time.perf_counter()
        idx = np.asarray(idx)
        scale = world / float(step_size)
        w = (w_all[idx] * torch.as_tensor(rescale, dtype=torch.float32)).to(device)
        opt.zero_grad(set_to_none=True)
        parallel.last_bucket_time(model, reset=True)
        parts, loss_sum, tokens = [], torch.zeros((), device=device), 0
        mbs: list = micro_batches(len(idx), lengths[idx], grad_accum, micro_batch_tokens)
        passes = max(len(mbs), 1) if distributed else len(mbs)  # a rank without samples still syncs
        if sharded and distributed:  # FSDP gathers every layer in every pass: same count on every rank
            count = torch.tensor([passes], device=device)
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            passes = int(count.item())
        mbs += [None] * (passes - len(mbs))  # zero-weight passes
        for k, mb in enumerate(mbs):
            rows, w_mb = (idx[mb], w[torch.as_tensor(mb)]) if mb is not None else \
                ([0], torch.zeros(1, device=device))
            batch = {k2: v.to(device) for k2, v in collate([encoded[i] for i in rows], pad_id).items()}
            with parallel.gradient_sync(model, k == len(mbs) - 1):
                with autocast(precision, device):
                    loss, mb_losses = weighted_loss(model, batch, w_mb, scale)
                (scaler.scale(loss) if scaler else loss).backward()
            if mb is not None:
                parts.append(mb_losses.float())
                tokens += int(batch["attention_mask"].sum())
            loss_sum = loss_sum + loss.detach().float()
        losses = torch.cat(parts) if parts else torch.zeros(0, device=device)
        compute_s = (parallel.last_bucket_time(model) or time.perf_counter()) - ts
        extras = [loss_sum.reshape(1) / scale]  # this rank's sum of w_i l_i
        if source.needs_losses:
            seen = torch.zeros(2 * n)
            seen[torch.as_tensor(idx)] = losses.cpu()
            seen[n + torch.as_tensor(idx)] = 1.0
            extras.append(seen.to(device))
        extra = torch.cat(extras)
        if distributed:  # waits for the slowest rank: the rest of the exposed sync
            dist.all_reduce(extra)
        sync_s = time.perf_counter() - ts - compute_s
        if source.needs_losses:
            got = extra[1:].cpu().numpy()
            mask = got[n:] > 0
            source.observe(np.flatnonzero(mask), got[:n][mask])
        if scaler is not None:
            scaler.unscale_(opt)  # every rank holds the same reduced gradients: same skip decision
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        sched.step()
        rec = {
            "step": g, "epoch": epoch, "loss": float(losses.mean()),
            "weighted_loss": float(extra[0]) / float(step_size),
            "lr": sched.get_last_lr()[0], "samples": int(len(idx)),
            "tokens": tokens, "compute_s": compute_s, "sync_s": sync_s,
            "step_s": time.perf_counter() - ts, "tokens_per_s": tokens / max(1e-9, compute_s),
            "peak_mem_mb": peak_memory_mb(device),
            "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            "time": time.time(),  # wall clock (the MLflow curve's timestamps)
            "pid": os.getpid(),  # a resumed run's log holds the steps of more than one process
        }
        history.append(rec)
        g += 1
        if on_step is not None:
            on_step(g, rec)
        if checkpoint_dir is not None and checkpoint_every and g % checkpoint_every == 0 and (rank == 0 or sharded):
            save_checkpoint(checkpoint_dir, model, opt, sched, source, (epoch, step + 1), digest, history,
                            scaler, sharded, rank)
        if rank == 0 and (g % log_every == 1 or g == total):
            el = time.perf_counter() - t0
            log.info("epoch %d step %d/%d loss %.4f lr %.2e %.0f ms/step", epoch, g, total,
                     rec["weighted_loss"], rec["lr"], 1000 * el / max(1, len(history)))
    return history


def plan_stub(source: Any) -> AllocationPlan:
    """Identity stand-in for a dynamic source (its seed and shape define its batches)."""
    return AllocationPlan(np.array([[source.n, source.world, source.batch, source.epochs, source.seed]]),
                          source.world, source.epochs, 0)


def gather_rank_timings(history: list[dict], world_size: int) -> list[dict]:
    """Per step, every rank's compute/sync seconds and tokens (lists indexed by rank)."""
    import torch.distributed as dist

    mine = [(h["compute_s"], h["sync_s"], h["tokens"]) for h in history]
    ranks = [mine]
    if world_size > 1:
        ranks = [None] * world_size
        dist.all_gather_object(ranks, mine)
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
