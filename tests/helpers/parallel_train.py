"""Run under torchrun: train a fixed uneven plan (one step leaves rank 1 without a sample)
with train.strategy STRATEGY; rank 0 saves the final, unsharded weights, every step's
per-rank timings (OUT.timings.json) and how its loss was computed (OUT.loss_path). With
DELAY, rank 1 sleeps DELAY seconds in each training forward (a straggler; the loss's one-time
checks run in eval mode); with GRAD_ACCUM, each rank's share of a step is cut into that many
micro-batches (ranks then run different numbers of passes); SYSTEM (comma-separated token ids)
puts a shared system prompt before every sample.

Usage: torchrun --nproc_per_node=2 tests/helpers/parallel_train.py MODEL_DIR OUT STRATEGY [DELAY [GRAD_ACCUM [SYSTEM]]]
"""

import json
import sys
import time

import numpy as np
import torch
from safetensors.torch import save_file

from clusterft.runtime import distributed, parallel
from clusterft.runtime.loop import gather_rank_timings, train_on_plan
from clusterft.runtime.model import load_model
from clusterft.spec.config import TrainConfig
from tests.helpers.grad_case import CASE_WEIGHTS, case_plan, case_samples


def main(model_dir: str, out: str, strategy: str, delay: str = "0", grad_accum: str = "1", system: str = "") -> None:
    info = distributed.init_distributed()
    base = load_model(model_dir)
    if info.rank == 1 and float(delay):
        base.register_forward_pre_hook(lambda mod, _: time.sleep(float(delay)) if mod.training else None)
    model = parallel.wrap(base, strategy, info)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    t = TrainConfig(lr=0.5, warmup_ratio=0.0, grad_accum=int(grad_accum))
    history = train_on_plan(model, case_samples(tuple(int(t) for t in system.split(",") if t)), np.array(CASE_WEIGHTS), case_plan(info.world_size), t, info,
                            optimizer=opt)
    json.dumps(history, allow_nan=False)  # strict JSON on every rank: rank 1's empty step has no NaN loss
    timings = gather_rank_timings(history)
    weights = parallel.full_state_dict(model)
    if info.is_main:
        with open(out + ".timings.json", "w") as f:
            json.dump(timings, f)
        with open(out + ".loss_path", "w") as f:
            f.write(history[-1]["loss_path"])
        save_file({n: t.detach().clone() for n, t in weights.items()}, out)  # tied weights: copies
    distributed.barrier()
    distributed.cleanup()


if __name__ == "__main__":
    main(*sys.argv[1:])
