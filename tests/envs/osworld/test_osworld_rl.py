"""RL on OSWorld: configs/osworld-local.yaml's env, real desktops, 2 learner steps (the file runs on Ray's
env-worker pool; CI runs it through the local runtime)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from rz_agents.cli.train import RunConfig
from rz_agents.config_io import load_config
from rz_agents.runtime import LocalRun

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "osworld-local.yaml"

pytestmark = pytest.mark.skipif(
    not (shutil.which("Xvfb") and shutil.which("openbox")), reason="needs xvfb and openbox"
)

# The file's run on real desktops with a tiny random Qwen3 (byte tokenizer: a 320-token vocabulary
# keeps the learner's logits small) instead of SmolLM2, two short os tasks and two learner steps:
# what CI can afford.
TINY = [
    "runtime=local",
    "actors.env_workers=1",
    "model.checkpoint=null",
    "tokenizer=byte",
    "model.model_type=qwen3",
    "model.tiny_overrides={hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, "
    "num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, max_position_embeddings: 4096}",
    "steps=2",
    "mode=sync",
    "env.tasks=[{id: rz-os-mkdir-nested}, {id: rz-os-rename-file}]",
    "env.kwargs.max_turns=2",
    "env.kwargs.pause=0.0",
    "engine.max_len=4096",
    "rollout.group_size=2",
    "rollout.groups_per_batch=1",
    "rollout.max_concurrent_episodes=2",
    "rollout.limits.max_turns=2",
    "rollout.limits.max_tokens_per_turn=12",
    "rollout.limits.max_episode_tokens=4000",
    "learner.micro_batch_tokens=8192",
]


def _desktops() -> set[str]:
    """Live desktop sessions on this machine (by their command line)."""
    out = set()
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"rz_agents.envs.osworld.session" in f.read():
                    out.add(pid)
        except OSError:
            continue
    return out


def test_the_config_file_is_valid():
    cfg = load_config(RunConfig, CONFIG)
    assert cfg.env.id == "rz_agents/OSWorld-v0" and len(cfg.env.tasks) == 13
    assert cfg.rollout.limits.max_episode_tokens < cfg.engine.max_len
    # the desktops live in the Ray env-worker pool, an equal share each, reset in place
    assert cfg.runtime == "ray" and cfg.actors.env_workers >= 2
    assert cfg.rollout.max_concurrent_episodes % cfg.actors.env_workers == 0
    # the engine runs every desktop's episode at once
    assert cfg.engine.max_running >= cfg.rollout.max_concurrent_episodes
    assert cfg.env.kwargs["provider_options"] == {"warm_reset": True}


def test_two_learner_steps_on_real_desktops():
    before = _desktops()
    cfg = load_config(RunConfig, CONFIG, TINY)
    run = LocalRun(cfg)
    try:
        summary = asyncio.run(run.train())
    finally:
        run.close()
    assert summary["steps"] == 2 and summary["version"] == 2
    rollout = summary["rollout"]
    assert rollout["episodes_failed"] == 0 and rollout["episodes_finished"] >= 4
    for step in run.history:
        assert (
            step["learner_tokens"] > 2 * 1500
        )  # 2 episodes a step, each prompt with the desktop tree (bytes)
        assert step["lag_max"] == 0
    assert _desktops() - before == set()  # every desktop stopped with its env
