"""Learner-step time with and without ``skip_uniform_groups`` on the same batches, measured in one run.

    python bench/skip_uniform.py [--uniform 0.5] [--reps 5] [--json]

A batch of ``--groups`` groups of ``--group-size`` trajectories (tiny Qwen3 model, random byte tokens), a
``--uniform`` fraction of the groups with all rewards equal. The two learners start from the same weights;
each repetition steps both on the same batch, alternating which goes first, so a busy machine slows both
alike. Printed: median step time of each, their ratio, tokens trained, and how far apart the weights are
after each step: the skipped groups contribute exact zeros, so the updates agree bit for bit when the
batch fits one micro-batch; across micro-batches the gradient sums run in another order (float rounding).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig
from rz_agents.trajectory import Trajectory


def _batch(rng: random.Random, groups: int, size: int, uniform: float, length: int, version: int) -> list:
    out = []
    for g in range(groups):
        flat = g < round(uniform * groups)
        for _ in range(size):
            prompt, sampled = 16, length - 16
            tokens = [rng.randrange(256) for _ in range(length)]
            mask = [False] * prompt + [True] * sampled
            reward = 0.0 if flat else float(rng.random() < 0.5)
            out.append(
                Trajectory(tokens, mask, [-1.0] * length, [-1] * prompt + [version] * sampled, reward, g)
            )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument(
        "--uniform", type=float, default=0.5, help="fraction of groups whose rewards are all equal"
    )
    p.add_argument("--length", type=int, default=160)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    learners = {}
    for skip in (False, True):
        torch.manual_seed(0)
        model = Transformer(ModelConfig.tiny("qwen3", vocab_size=320, hidden_size=128, intermediate_size=384))
        cfg = LearnerConfig(optim=OptimConfig(lr=1e-4), skip_uniform_groups=skip)
        learners[skip] = Learner(model, cfg, max_lag=None)
    times: dict[bool, list[float]] = {False: [], True: []}
    tokens: dict[bool, int] = {False: 0, True: 0}
    identical, max_diff = True, 0.0
    rng = random.Random(0)
    for rep in range(args.reps):
        batch = _batch(rng, args.groups, args.group_size, args.uniform, args.length, learners[False].version)
        for skip in (False, True) if rep % 2 == 0 else (True, False):
            t0 = time.perf_counter()
            m = learners[skip].step(batch)
            times[skip].append(time.perf_counter() - t0)
            tokens[skip] += m["learner_tokens"]
        a, b = learners[False].model.state_dict(), learners[True].model.state_dict()
        identical = identical and all(torch.equal(a[k], b[k]) for k in a)
        max_diff = max(max_diff, max(float((a[k] - b[k]).abs().max()) for k in a))
    full, skip = statistics.median(times[False]), statistics.median(times[True])
    result = {
        "uniform_fraction": args.uniform,
        "step_s_full": full,
        "step_s_skip": skip,
        "skip_over_full": skip / full,
        "tokens_full": tokens[False],
        "tokens_skip": tokens[True],
        "weights_bit_identical": identical,
        "weights_max_abs_diff": max_diff,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"uniform groups {args.uniform:.0%}: learner step {full:.3f} s -> {skip:.3f} s with the skip "
            f"(x{skip / full:.2f}); tokens trained {tokens[False]:,} -> {tokens[True]:,}; weights "
            f"bit-identical: {identical} (max |dw| {max_diff:.1e})"
        )


if __name__ == "__main__":
    main()
