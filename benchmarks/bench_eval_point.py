"""One validation point of a training curve (evaluate.every) four ways, side by side on the same
partly trained model: generating every answer; reading right answers off the teacher-forced
pass (runtime.generation.greedy_answers) with every row run whole; the same with the prompt
tokens every row shares (system prompt, chat template) run once (ResponseLoss's prefix
cache); and that with a wrong answer kept as far as its first wrong token, not generated (what a
curve point runs: `complete=False`). Seconds per point, answers, scores and losses equal, and
what 4 points cost against a run's training time at the profile's setting.

The model is LoRA-tuned for --steps steps (the profile's lora, lr and per-device batch, one
process, one thread as a torchrun worker has), so it answers most validation rows as a curve
point mid-run does. Each way runs once untimed (a batch shape's first call is slower; a
run's later points reuse it), then is timed --repeats times, alternating, on one rank's
share of the validation split (every second row, as a point of a 2-worker run scores).

    .venv/bin/python benchmarks/bench_eval_point.py --params profiles/smollm2-redundant.yaml
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
import torch
from tqdm import tqdm

from clusterft.core.curves import eval_steps
from clusterft.core.losses import ResponseLoss
from clusterft.core.scoring import exact_match
from clusterft.core.tokens import collate, encode_all, shared_prefix
from clusterft.runtime.data import load_examples, renderer
from clusterft.runtime.generation import generate_answers, greedy_answers, sample_losses
from clusterft.runtime.model import add_lora, base_model_dir, load_model, load_tokenizer
from clusterft.spec.config import load_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="profiles/smollm2-redundant.yaml")
    ap.add_argument("--steps", type=int, default=150, help="LoRA steps before the point")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(args.params)
    render = renderer(cfg)
    tok = load_tokenizer(base_model_dir(cfg), cfg.model)
    torch.manual_seed(0)
    model = add_lora(load_model(base_model_dir(cfg), cfg.model), cfg.lora)
    train = encode_all(load_examples(cfg, "train", render), tok, cfg.data.max_length)
    share = load_examples(cfg, "validation", render)[0::2]
    scored = [x for x in share if x.scored]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.train.lr)
    loss = ResponseLoss(model)
    rng = random.Random(0)
    model.train()
    t0 = time.perf_counter()
    for _ in tqdm(range(args.steps), desc="LoRA steps", unit="step"):
        b = collate(rng.sample(train, cfg.train.per_device_batch), tok.pad_token_id)
        l = loss(model, b).mean()
        opt.zero_grad()
        l.backward()
        opt.step()
    step_s = (time.perf_counter() - t0) / args.steps
    e, ml = cfg.evaluate, cfg.data.max_length

    whole, cached = ResponseLoss(model, cache_prefix=False), ResponseLoss(model)
    generated = {}

    def every() -> tuple[list[str], list[float]]:
        answers = generate_answers(model, tok, [x.prompt for x in scored], e.batch_size, e.max_new_tokens, False)
        return answers, sample_losses(model, tok, share, ml, e.batch_size, whole)

    def read_off(with_loss: ResponseLoss, complete: bool = True) -> tuple[list[str], list[float]]:
        got = greedy_answers(model, tok, share, ml, e.batch_size, e.max_new_tokens, with_loss, progress=False,
                             complete=complete)
        generated[(with_loss is cached, complete)] = got.generated
        return got.answers, got.losses

    ways = {"generate every answer": every, "read off, rows run whole": lambda: read_off(whole),
            "read off, shared prompt cached": lambda: read_off(cached),
            "wrong answers cut (curve point)": lambda: read_off(cached, complete=False)}
    times: dict[str, list[float]] = {name: [] for name in ways}
    results = {name: fn() for name, fn in ways.items()}  # untimed: a run's later points reuse kernels
    for _ in range(args.repeats):
        for name, fn in ways.items():
            t = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - t)
    (a_ans, a_loss), (b_ans, b_loss), (c_ans, c_loss), (d_ans, d_loss) = results.values()
    em = exact_match(scored, b_ans)
    print(f"model after {args.steps} LoRA steps ({step_s:.2f} s a step, 1 thread): validation share "
          f"{len(share)} rows, {len(scored)} scored, macro EM {em['macro_exact_match']:.3f}")
    for name, ts in times.items():
        print(f"{name:32s} {np.mean(ts):7.1f} s a point  ({', '.join(f'{t:.1f}' for t in ts)})")
    mean = {name: np.mean(ts) for name, ts in times.items()}
    prompt = shared_prefix(encode_all(share, tok, ml))
    print(f"read off / generate every: {mean['read off, rows run whole'] / mean['generate every answer']:.2f}x; "
          f"answers generated {generated[(False, True)]} of {len(scored)}; answers equal: {a_ans == b_ans}; "
          f"held-out losses equal: {np.allclose(a_loss, b_loss, rtol=1e-5)}")
    print(f"shared prompt cached / rows whole: {mean['read off, shared prompt cached'] / mean['read off, rows run whole']:.2f}x "
          f"({len(prompt)} shared tokens of {np.mean([x.n_tokens for x in encode_all(share, tok, ml)]):.1f} a row; cache used: "
          f"{cached.prefix_ok}); answers equal: {c_ans == b_ans}; held-out losses equal: "
          f"{np.allclose(c_loss, b_loss, rtol=1e-4, atol=1e-6)}")
    cut = sum(d != a for d, a in zip(d_ans, a_ans))
    print(f"wrong answers cut / shared prompt cached: {mean['wrong answers cut (curve point)'] / mean['read off, shared prompt cached']:.2f}x "
          f"(answers generated {generated[(True, False)]} against {generated[(True, True)]}; {cut} kept only as far as "
          f"their first wrong token, each the start of the generated answer: "
          f"{all(a.startswith(d) for d, a in zip(d_ans, a_ans))}); exact match per skill equal: "
          f"{exact_match(scored, d_ans) == exact_match(scored, a_ans)}; held-out losses equal: {d_loss == c_loss}")
    n = len(load_examples(cfg, "train", render))
    g = cfg.train.nproc * cfg.train.per_device_batch
    for label, kept in [("full", 1.0), *((f"budget {b}", b) for b in cfg.experiment.budgets)]:
        steps = int(n * kept) * cfg.train.epochs // g
        train_s, points = steps * step_s, len(eval_steps(steps, e.every))
        shares = [points * t / train_s for t in mean.values()]
        print(f"{label:10s} {steps:5d} steps, ~{train_s:6.0f} s training: {points} points cost "
              + " -> ".join(f"{100 * c:.1f}%" for c in shares) + " of it")


if __name__ == "__main__":
    main()
