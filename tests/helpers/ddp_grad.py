"""Run under torchrun: one DDP step of the weighted loss on a fixed plan; rank 0 saves grads.

Usage: torchrun --nproc_per_node=2 tests/helpers/ddp_grad.py MODEL_DIR OUT.safetensors
"""

import sys

import numpy as np
import torch
from safetensors.torch import save_file
from torch.nn.parallel import DistributedDataParallel as DDP

from clusterft import distributed
from clusterft.allocation import AllocationPlan
from clusterft.data import collate
from clusterft.model import load_model
from clusterft.train_loop import sync_gradients, weighted_loss
from tests.helpers.grad_case import CASE_PLAN, CASE_WEIGHTS, case_samples


def main(model_dir: str, out: str) -> None:
    info = distributed.init_distributed()
    model = DDP(load_model(model_dir))
    plan = AllocationPlan(np.array(CASE_PLAN), info.world_size, 1, 1)
    samples = case_samples()
    (_, _, idx), = list(plan.rank_batches(info.rank))
    batch = collate([samples[i] for i in idx], 0)
    w = torch.tensor(CASE_WEIGHTS, dtype=torch.float32)[idx]
    with model.no_sync():  # the trainer's path: local backward, then an explicit all-reduce
        loss, _ = weighted_loss(model, batch, w, plan.world_size / float(plan.step_sizes()[0, 0]))
        loss.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    sync_gradients(params, info.world_size, loss.detach().reshape(1))
    if info.is_main:
        save_file({n: p.grad.contiguous() for n, p in model.module.named_parameters()}, out)
    distributed.barrier()
    distributed.cleanup()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
