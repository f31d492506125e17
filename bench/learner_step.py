"""Learner step throughput: rz's learner (aligned and standard op sets) vs a plain HF transformers step.

Both sides train SmolLM2-135M-Instruct (the packaged checkpoint, rz_agents.model.gguf; fp32) on the same
tokens: --micro-batch-tokens tokens as trajectories of --seq tokens each (a --prompt-token prompt, the
rest sampled), one micro-batch per step. Equal lengths, so HF's [trajectories, seq] batch holds exactly
the packed tokens and no padding.

  rz      ``Learner.step``: packed forward (per-token log-probs), the REINFORCE loss, backward, gradient
          clipping, AdamW (its defaults: lr --lr, betas 0.9/0.999, eps 1e-8, no weight decay).
  hf      ``LlamaForCausalLM`` forward on the batch, log_softmax of the logits, the sampled tokens'
          log-probs times their advantages (the same policy-gradient loss), backward, clipping to 1.0,
          ``torch.optim.AdamW(foreach=True)`` with the same settings. Its attention: sdpa (the default).

Each side runs in its own process (so its peak RSS is its own), --steps steps per process: the first is
a warm-up (AdamW state allocated, packed weights built), the rest are timed. Processes run in alternating
rounds (--rounds; the order rotates each round), threads pinned to --threads on every side. Per side:
tokens per wall-second and per CPU-second (medians over rounds) and the peak RSS of the process; each ratio
is the median over rounds of that round's ratio, by --metric (cpu: robust on a shared machine).

  python bench/learner_step.py --json                  # ~10 min on 2 shared cores
  python bench/learner_step.py --json --activation-checkpointing
  python bench/learner_step.py --json --before /tmp/base   # + rz_aligned from another source tree
                                                            # (e.g. `git archive BASE | tar -x -C /tmp/base`)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

SIDES = ("rz_aligned", "rz_standard", "hf")
BEFORE = "rz_aligned_before"  # rz_aligned run from the --before source tree (a before/after in one run)
GB = 2**30


def batch_tokens(micro_batch_tokens: int, seq: int, prompt: int, vocab: int):
    """Trajectory token lists, their sampled-token masks and rewards (fixed seed: the same on every side)."""
    rng = random.Random(0)
    n = max(1, micro_batch_tokens // seq)
    tokens = [[rng.randrange(vocab) for _ in range(seq)] for _ in range(n)]
    masks = [[False] * prompt + [True] * (seq - prompt) for _ in range(n)]
    rewards = [float(i % 3) for i in range(n)]
    return tokens, masks, rewards


class PeakRss:
    """The process's peak resident set, sampled every 5 ms by a daemon thread."""

    def __init__(self) -> None:
        import psutil

        self.proc, self.peak = psutil.Process(), 0
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while True:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)


def rz_steps(a, kernels: str) -> list[dict]:
    """Learner.step on the packaged SmolLM2 with the given op set; per-step wall/cpu seconds."""
    from rz_agents.model.checkpoint import load_hf_checkpoint
    from rz_agents.model.gguf import smollm2_checkpoint_dir
    from rz_agents.trainer.learner import Learner, LearnerConfig
    from rz_agents.trainer.optim import OptimConfig
    from rz_agents.trajectory import Trajectory

    model = load_hf_checkpoint(smollm2_checkpoint_dir(), kernels=kernels, dtype="float32")
    if a.activation_checkpointing:
        model.config.activation_checkpointing = True
    tokens, masks, rewards = batch_tokens(a.micro_batch_tokens, a.seq, a.prompt, model.config.vocab_size)
    batch = [
        Trajectory(t, m, [0.0 if not s else -2.0 for s in m], [-1 if not s else 0 for s in m], r, i // 4)
        for i, (t, m, r) in enumerate(zip(tokens, masks, rewards, strict=True))
    ]
    cfg = LearnerConfig(optim=OptimConfig(lr=a.lr), micro_batch_tokens=a.micro_batch_tokens)
    learner = Learner(model, cfg, max_lag=None)
    out = []
    for _ in range(a.steps):
        c0, t0 = time.process_time(), time.perf_counter()
        m = learner.step(batch)
        out.append({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0,
                    "tokens": m["learner_tokens"]})
    return out


def hf_steps(a) -> list[dict]:
    """A plain transformers forward + backward + AdamW step on the same tokens."""
    from transformers import AutoModelForCausalLM

    from rz_agents.model.gguf import smollm2_checkpoint_dir

    model = AutoModelForCausalLM.from_pretrained(smollm2_checkpoint_dir(), dtype=torch.float32)
    model.train()
    if a.activation_checkpointing:
        model.gradient_checkpointing_enable()
    tokens, masks, rewards = batch_tokens(a.micro_batch_tokens, a.seq, a.prompt, model.config.vocab_size)
    ids = torch.tensor(tokens)
    # targets: token t+1 scored at position t; advantage = reward - group mean (groups of 4, like rz's)
    target, mask = ids[:, 1:], torch.tensor(masks)[:, 1:].float()
    r = torch.tensor(rewards)
    groups = torch.arange(len(rewards)) // 4
    mean = torch.zeros(int(groups.max()) + 1).index_add_(0, groups, r) / torch.bincount(groups).float()
    adv = (r - mean[groups]).unsqueeze(1)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            foreach=True)
    out = []
    for _ in range(a.steps):
        c0, t0 = time.process_time(), time.perf_counter()
        logits = model(input_ids=ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
        loss = -(adv * logp * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0,
                    "tokens": int(ids.numel())})
    return out


def worker(a) -> None:
    """One side's process: print one JSON line with its timed steps and peak RSS."""
    torch.set_num_threads(a.threads)
    peak = PeakRss()
    kernels = "aligned" if a.worker == BEFORE else a.worker.removeprefix("rz_")
    steps = hf_steps(a) if a.worker == "hf" else rz_steps(a, kernels)
    timed = steps[1:] or steps
    tokens = sum(s["tokens"] for s in timed)
    print(json.dumps({
        "side": a.worker,
        "tokens_per_step": timed[0]["tokens"],
        "tok_per_s": tokens / sum(s["wall"] for s in timed),
        "tok_per_cpu_s": tokens / sum(s["cpu"] for s in timed),
        "peak_rss_gb": peak.peak / GB,
    }), flush=True)


def run_side(a, side: str) -> dict:
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", side]
    for k in ("micro_batch_tokens", "seq", "prompt", "steps", "threads", "lr"):
        argv += [f"--{k.replace('_', '-')}", str(getattr(a, k))]
    if a.activation_checkpointing:
        argv.append("--activation-checkpointing")
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
    if side == BEFORE:  # the other tree's package and kernels first on the path (ahead of any install)
        tree = Path(a.before).resolve()
        env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "kernels"), env.get("PYTHONPATH", "")])
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=a.timeout)
    if done.returncode != 0:
        raise SystemExit(f"{side} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="end with one JSON object (the summary)")
    ap.add_argument("--micro-batch-tokens", type=int, default=2048)
    ap.add_argument("--seq", type=int, default=340, help="tokens per trajectory")
    ap.add_argument("--prompt", type=int, default=100, help="prompt tokens per trajectory (not trained)")
    ap.add_argument("--steps", type=int, default=3, help="steps per process; the first is a warm-up")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    ap.add_argument("--metric", default="cpu", choices=["cpu", "wall"])
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per side process")
    ap.add_argument("--before", help="a source tree (repository root) whose rz_aligned also runs, as "
                    f"side {BEFORE}, in the same alternating rounds")
    ap.add_argument("--worker", choices=(*SIDES, BEFORE), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return
    if a.before:
        if not (Path(a.before) / "kernels" / "rz_kernels").is_dir():
            raise SystemExit(f"--before {a.before}: not a source tree (no kernels/rz_kernels in it)")
        a.sides = [*a.sides, BEFORE]
    t_start, load_start = time.time(), os.getloadavg()[0]
    rounds = []
    for r in range(a.rounds):
        order = a.sides[r % len(a.sides):] + a.sides[: r % len(a.sides)]  # rotate: no side always first
        this = {side: run_side(a, side) for side in order}
        rounds.append(this)
        if not a.json:
            print(f"round {r + 1}: {json.dumps(this)}", flush=True)
    key = "tok_per_cpu_s" if a.metric == "cpu" else "tok_per_s"

    def median(side: str, k: str) -> float:
        return round(statistics.median(rd[side][k] for rd in rounds), 3)

    def ratio(x: str, y: str) -> float | None:
        if x not in a.sides or y not in a.sides:
            return None
        return round(statistics.median(rd[x][key] / rd[y][key] for rd in rounds), 3)

    summary = {
        "model": "SmolLM2-135M-Instruct (packaged checkpoint), float32",
        "tokens_per_step": rounds[0][a.sides[0]]["tokens_per_step"],
        "activation_checkpointing": a.activation_checkpointing,
        "threads": a.threads,
        "rounds": a.rounds,
        "timed_steps_per_round": max(a.steps - 1, 1),
        "ratio_metric": key,
        "results": {
            s: {k: median(s, k) for k in ("tok_per_s", "tok_per_cpu_s", "peak_rss_gb")} for s in a.sides
        },
        "rz_over_hf_tokens_per_s": ratio("rz_aligned", "hf"),
        "rz_standard_over_hf_tokens_per_s": ratio("rz_standard", "hf"),
        "rz_aligned_over_before": ratio("rz_aligned", BEFORE),
        "before_tree": a.before,
        "per_round": rounds,
        "loadavg_start_end": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "seconds": round(time.time() - t_start, 1),
    }
    print(json.dumps(summary, indent=None if a.json else 2))


if __name__ == "__main__":
    main()
