"""Exact per-sample gradients of the LoRA weights from one batched backward pass.

For a Linear y = x W^T, dL/dW = sum_t dy_t^T x_t. Forward hooks on every peft `lora_A` /
`lora_B` Linear keep its input x [B, T, in] and output y [B, T, out]; one autograd call of
sum_b loss_b w.r.t. all the y gives dy, and sample b's gradient is
einsum('bto,bti->boi', dy, x)[b]. Samples do not interact in a causal LM (no batch norm;
right padding is invisible to real tokens and has no loss), so dy of sample b is exactly
the gradient of its own loss. No vmap, no batch-size-1 loop, no parameter .grad touched.

The loss applies the output layer only at response positions (ResponseLoss): a ~135M model
with a 49k vocabulary otherwise spends a fifth of its forward and backward FLOPs, and most
of its memory traffic, on logits of prompt and pad tokens that have no loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from clusterft.core.losses import ResponseLoss
from clusterft.errors import LoraGradError

LORA_FACTORS = ("lora_A", "lora_B")


def lora_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """Trainable parameters in `named_parameters` order: the order of the flattened gradient."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def lora_sites(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    """(weight name, Linear) of every LoRA factor, in `lora_parameters` order.

    Raises LoraGradError if any trainable parameter is not such a weight (bias, DoRA
    magnitude, embedding LoRA, modules_to_save): its per-sample gradient would be missed."""
    linears = {f"{name}.weight": mod for name, mod in model.named_modules()
               if isinstance(mod, torch.nn.Linear) and any(f".{f}." in f"{name}." for f in LORA_FACTORS)}
    named = lora_parameters(model)
    missing = [n for n, _ in named if n not in linears]
    if missing:
        raise LoraGradError(f"trainable parameters that are not LoRA Linear weights: {missing[:5]}; "
                            "only plain LoRA on Linear layers is supported")
    if not named:
        raise LoraGradError("the model has no trainable LoRA parameters (load the adapter trainable)")
    return [(n, linears[n]) for n, _ in named]


def _capture(store: dict[int, tuple[torch.Tensor, torch.Tensor]], index: int,
             module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> None:
    """Forward hook: keep (input, output) of LoRA factor `index`; one call per forward."""
    if index in store:
        raise LoraGradError(f"LoRA module {index} ran twice in one forward pass")
    store[index] = (inputs[0].detach(), output)


class PerSampleLoraGrads:
    """Collated batch -> [B, P] float32: each sample's gradient of its mean response-token
    loss w.r.t. all LoRA weights, flattened row-major in `lora_parameters` order."""

    def __init__(self, model: torch.nn.Module, response_only_head: bool = True) -> None:
        self.model = model
        self.sites = lora_sites(model)
        self.names = [n for n, _ in self.sites]
        self.n_params = sum(m.weight.numel() for _, m in self.sites)
        self.loss = ResponseLoss(model, response_only_head)

    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        store: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.loss.check(self.model, batch)  # before the hooks: they allow one forward
        handles = [m.register_forward_hook(partial(_capture, store, i))
                   for i, (_, m) in enumerate(self.sites)]
        try:
            with torch.enable_grad():
                loss = self.loss(self.model, batch).sum()
        finally:
            for h in handles:
                h.remove()
        xs, ys = zip(*(store[i] for i in range(len(self.sites))))
        dys = torch.autograd.grad(loss, ys, materialize_grads=True)
        return torch.cat([torch.einsum("bto,bti->boi", dy.float(), x.float()).flatten(1)
                          for x, dy in zip(xs, dys)], dim=1)


def loop_per_sample_grads(model: torch.nn.Module, batch: dict[str, torch.Tensor],
                          loss: ResponseLoss | None = None) -> torch.Tensor:
    """Reference [B, P]: one forward + autograd per sample at batch size 1, pads cut off,
    full logits (what LESS does) unless `loss` says otherwise; same layout as
    PerSampleLoraGrads."""
    params = [p for _, p in lora_parameters(model)]
    loss = loss or ResponseLoss(model, response_only=False)
    rows = []
    for i, n in enumerate(batch["attention_mask"].sum(1).tolist()):
        one = {k: v[i : i + 1, :n] for k, v in batch.items()}
        grads = torch.autograd.grad(loss(model, one).sum(), params)
        rows.append(torch.cat([g.float().flatten() for g in grads]))
    return torch.stack(rows)


@dataclass
class AdamMoments:
    """Warmup AdamW state flattened like the gradients: exp_avg, exp_avg_sq [P]."""

    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    beta1: float
    beta2: float
    eps: float

    def to(self, device: torch.device | str) -> "AdamMoments":
        return AdamMoments(self.exp_avg.to(device), self.exp_avg_sq.to(device),
                           self.beta1, self.beta2, self.eps)

    def precondition(self, g: torch.Tensor) -> torch.Tensor:
        """[B, P] -> [B, P]: one Adam step's update direction per sample (LESS):
        m' = b1 m + (1-b1) g, v' = b2 v + (1-b2) g^2, m' / (sqrt(v') + eps)."""
        m = self.beta1 * self.exp_avg + (1 - self.beta1) * g
        v = self.beta2 * self.exp_avg_sq + (1 - self.beta2) * g.square()
        return m / (v.sqrt() + self.eps)
