"""Peak RSS of learner steps on a SmolLM2-135M-shaped model (random weights), per micro-batch size.

Builds the recipe's architecture from the packaged SmolLM2-135M-Instruct's config.json (llama, hidden 576,
30 layers, 9 heads / 3 KV heads, vocab 49,152, tied embeddings; fp32, aligned kernels), fills one
micro-batch of --micro-batch-tokens with trajectories of --seq tokens, and runs --steps ``Learner.step``
calls (the second one holds the AdamW state too), sampling the resident set every 5 ms. Prints per step the
peak and end RSS, then the bytes of live tensors and the RSS after ``malloc_trim`` (what glibc kept of
freed memory). Stops the process above --limit-gb.

  python bench/learner_step_memory.py --micro-batch-tokens 4096
  python bench/learner_step_memory.py --micro-batch-tokens 4096 --activation-checkpointing
  python bench/learner_step_memory.py --micro-batch-tokens 4096 --dtype bfloat16 --json

Each run also prints the dry run's learner estimate for the same settings (rz_agents.runtime.memory_estimate:
the terms and their sum) beside the measured peak; --json ends with one JSON object holding both.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import threading
import time

import psutil
import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.gguf import smollm2_checkpoint_dir
from rz_agents.runtime.memory import trim_heap
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig
from rz_agents.trajectory import Trajectory

GB = 2**30


def smollm2_135m(layers: int, checkpointing: bool, dtype: str = "float32") -> ModelConfig:
    """The packaged SmolLM2-135M-Instruct's own config (the recipe's model), with ``layers`` layers."""
    config = json.loads((smollm2_checkpoint_dir() / "config.json").read_text())
    return ModelConfig.from_hf(config, dtype=dtype).replace(
        num_hidden_layers=layers, activation_checkpointing=checkpointing
    )


def trajectories(micro_batch_tokens: int, seq: int, vocab: int, prompt: int = 100) -> list[Trajectory]:
    rng = random.Random(0)
    out = []
    for i in range(max(1, micro_batch_tokens // seq)):
        sampled = seq - prompt
        tokens = [rng.randrange(vocab) for _ in range(seq)]
        blp = [0.0] * prompt + [-3.0 * rng.random() for _ in range(sampled)]
        mask, versions = [False] * prompt + [True] * sampled, [-1] * prompt + [0] * sampled
        out.append(Trajectory(tokens, mask, blp, versions, float(i % 3), i // 8))
    return out


def live_tensor_bytes() -> int:
    """Bytes of the tensors the garbage collector tracks (each storage once; oneDNN's packed weights, which
    have no storage to read, by their size)."""
    storages = {}
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor):
            try:
                s = o.untyped_storage()
                storages[s.data_ptr()] = s.nbytes()
            except NotImplementedError:  # an opaque (packed) tensor
                storages[("opaque", id(o))] = o.numel() * o.element_size()
    return sum(storages.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=340, help="tokens per trajectory")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument("--limit-gb", type=float, default=14.0)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--json", action="store_true", help="end with one JSON object: measured and estimated")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    proc = psutil.Process()
    peak = [0]

    def watch() -> None:
        while True:
            rss = proc.memory_info().rss
            peak[0] = max(peak[0], rss)
            if rss > a.limit_gb * GB:
                print(f"RSS {rss / GB:.2f} GB over --limit-gb, stopping", flush=True)
                os._exit(3)
            time.sleep(0.005)

    threading.Thread(target=watch, daemon=True).start()
    torch.manual_seed(0)
    config = smollm2_135m(a.layers, a.activation_checkpointing, a.dtype)
    model = Transformer(config)
    cfg = LearnerConfig(optim=OptimConfig(lr=1e-5), micro_batch_tokens=a.micro_batch_tokens)
    learner = Learner(model, cfg, max_lag=None)
    batch = trajectories(a.micro_batch_tokens, a.seq, model.config.vocab_size)
    print(f"{model.num_parameters():,} parameters; rss {proc.memory_info().rss / GB:.2f} GB", flush=True)
    peaks = []
    for s in range(a.steps):
        peak[0] = 0
        t0, c0 = time.perf_counter(), time.process_time()
        m = learner.step(batch)
        print(
            f"step {s}: {m['learner_tokens']} tokens, peak rss {peak[0] / GB:.2f} GB, end "
            f"{proc.memory_info().rss / GB:.2f} GB, wall {time.perf_counter() - t0:.1f} s "
            f"(forward {m['time_forward_s']:.1f}, backward {m['time_backward_s']:.1f}), "
            f"cpu {time.process_time() - c0:.1f} s",
            flush=True,
        )
        peaks.append(peak[0])
    live = live_tensor_bytes()
    trim_heap()
    print(f"live tensors {live / GB:.2f} GB; rss after malloc_trim {proc.memory_info().rss / GB:.2f} GB")
    est = learner_estimate(config, a.micro_batch_tokens, a.seq)
    print("estimate: " + ", ".join(f"{k} {v / GB:.2f}" for k, v in est.learner.items()), flush=True)
    measured = max(peaks[1:] or peaks)  # the second step holds the AdamW state too
    print(f"estimate {est.learner_total / GB:.2f} GB vs measured peak {measured / GB:.2f} GB "
          f"(estimate / measured {est.learner_total / measured:.3f})")
    if a.json:
        print(json.dumps({
            "dtype": a.dtype, "activation_checkpointing": a.activation_checkpointing,
            "micro_batch_tokens": a.micro_batch_tokens, "layers": a.layers, "threads": a.threads,
            "measured_peak_gib": round(measured / GB, 3),
            "estimate_gib": round(est.learner_total / GB, 3),
            "estimate_over_measured": round(est.learner_total / measured, 3),
            "estimate_terms_gib": {k: round(v / GB, 3) for k, v in est.learner.items()},
        }))


def learner_estimate(config: ModelConfig, micro_batch_tokens: int, seq: int):
    """The dry run's estimate for this learner: a CPU TrainConfig with the same model settings and budget."""
    from rz_agents.engine import EngineConfig
    from rz_agents.rollout.agent_loop import EpisodeLimits
    from rz_agents.rollout.controller import RolloutConfig
    from rz_agents.runtime import ModelSpec, TrainConfig
    from rz_agents.runtime.memory_estimate import estimate_memory

    spec = ModelSpec(dtype=config.dtype, activation_checkpointing=config.activation_checkpointing)
    limits = EpisodeLimits(max_turns=1, max_tokens_per_turn=seq, max_episode_tokens=seq)
    cfg = TrainConfig(
        model=spec,
        engine=EngineConfig(max_running=4, max_len=seq + 64),
        rollout=RolloutConfig(limits=limits),
        learner=LearnerConfig(micro_batch_tokens=micro_batch_tokens),
    )
    return estimate_memory(cfg, config)


if __name__ == "__main__":
    main()
