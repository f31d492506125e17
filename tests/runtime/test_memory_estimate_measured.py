"""The learner's memory estimate against a measured peak: a small llama-shaped model (SmolLM2's layout:
tied embeddings, 3:1 grouped KV heads), fp32 and the aligned op set on CPU, two real ``Learner.step`` calls in
a fresh process whose resident set is sampled every 2 ms; the second step (AdamW state allocated) is compared
with ``estimate_memory``'s learner total for the same settings. The model is sized so that every term is a
visible part of the peak (weights and AdamW state, the aligned GEMM's packed weight copies, activations, the
LM head's log-softmax, the process's own libraries): leaving one out moves the estimate by more than the
tolerance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rz_agents.engine import EngineConfig
from rz_agents.model import ModelConfig
from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.rollout.controller import RolloutConfig
from rz_agents.runtime import ModelSpec, TrainConfig
from rz_agents.runtime.memory_estimate import estimate_memory
from rz_agents.trainer.learner import LearnerConfig

ROOT = Path(__file__).resolve().parents[2]
TOKENS, SEQ = 2048, 256
SHAPE = dict(
    model_type="llama",
    vocab_size=32_768,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=64,
    tie_word_embeddings=True,
    max_position_embeddings=512,
)

# The worker: build the model, run two learner steps on TOKENS tokens, print the second step's peak RSS.
WORKER = """
import json, random, sys, threading, time
import psutil, torch
from rz_agents.model import ModelConfig, Transformer
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trajectory import Trajectory
torch.set_num_threads(1)
shape, tokens, seq, ckpt = json.loads(sys.argv[1])
proc, peak = psutil.Process(), [0]
def watch():
    while True:
        peak[0] = max(peak[0], proc.memory_info().rss)
        time.sleep(0.002)
threading.Thread(target=watch, daemon=True).start()
torch.manual_seed(0)
model = Transformer(ModelConfig.tiny(**shape).replace(dtype="float32", activation_checkpointing=ckpt))
learner = Learner(model, LearnerConfig(micro_batch_tokens=tokens), max_lag=None)
rng = random.Random(0)
batch = []
for i in range(tokens // seq):
    mask = [False] * 32 + [True] * (seq - 32)
    ids = [rng.randrange(shape["vocab_size"]) for _ in range(seq)]
    blp, versions = [-2.0 if m else 0.0 for m in mask], [0 if m else -1 for m in mask]
    batch.append(Trajectory(ids, mask, blp, versions, float(i % 3), i // 4))
learner.step(batch)
peak[0] = 0
learner.step(batch)
time.sleep(0.01)
print(json.dumps({"peak": peak[0]}))
"""


def measured_peak(ckpt: bool) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'kernels'}"}
    arg = json.dumps([SHAPE, TOKENS, SEQ, ckpt])
    done = subprocess.run(
        [sys.executable, "-c", WORKER, arg], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["peak"]


def estimate(ckpt: bool):
    config = ModelConfig.tiny(**SHAPE).replace(dtype="float32", activation_checkpointing=ckpt)
    limits = EpisodeLimits(max_turns=1, max_tokens_per_turn=SEQ, max_episode_tokens=SEQ)
    cfg = TrainConfig(
        model=ModelSpec(dtype="float32", activation_checkpointing=ckpt),
        engine=EngineConfig(max_running=4, max_len=SEQ + 64),
        rollout=RolloutConfig(limits=limits),
        learner=LearnerConfig(micro_batch_tokens=TOKENS),
    )
    return estimate_memory(cfg, config)


# Measured on 2026-12-07 (RSS per phase as bench/learner_step_memory.py prints it): checkpointing on, estimate
# 1,009 MiB vs a 985 MiB peak (1.02), off 1,328 vs 1,291 (1.03). Before the learner's start-up terms
# (torch._dynamo imported by torch.optim, 0.13 GiB; the GEMM guard's oneDNN state, 0.08) and the LM head's
# gradient partials the estimate was 730 MiB (0.74).
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("ckpt", [True, False], ids=["checkpointing_on", "checkpointing_off"])
def test_the_learner_estimate_is_within_ten_percent_of_the_measured_peak(ckpt):
    est = estimate(ckpt)
    # every term the measurement depends on is there, and each one is large enough to matter
    for term in (
        "weights",
        "gradients",
        "adamw_state_fp32",
        "packed_weights",
        "activations",
        "lm_head_logits",
        "lm_head_grad_partials",
        "process_baseline",
        "optimizer_imports",
        "gemm_guard_state",
    ):
        assert term in est.learner, term
    peak = measured_peak(ckpt)
    ratio = est.learner_total / peak
    assert 0.9 <= ratio <= 1.1, (ratio, peak, {k: round(v / 2**20) for k, v in est.learner.items()})
