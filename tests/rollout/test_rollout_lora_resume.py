"""A LoRA run stopped mid-run and resumed from its checkpoint is bitwise the uninterrupted run: adapter
tensors, their fp32 masters and AdamW state (bf16 model), the frozen base, and every step's reward. The base
here differs from the one the engine builds from the config (as after a warm start), so the resumed engine
must take the checkpoint's base once, not only the adapters (else lag-0 tokens would not score exactly:
assert_lag0_exact raises)."""

from __future__ import annotations

import asyncio

import torch

from rz_agents.model.lora import LoraConfig
from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import EnvSpec, LearnerSpec, LocalRun, ModelSpec, RolloutSpec, TrainConfig
from rz_agents.trainer.optim import OptimConfig


def _cfg(**kw):
    return TrainConfig(
        mode="sync",
        steps=4,
        seed=3,
        num_threads=1,
        model=ModelSpec(dtype="bfloat16"),
        env=EnvSpec(kwargs={"max_turns": 2}),
        rollout=RolloutSpec(
            group_size=2,
            groups_per_batch=2,
            max_concurrent_episodes=8,
            limits=EpisodeLimits(max_turns=2, max_tokens_per_turn=6, max_episode_tokens=200),
        ),
        learner=LearnerSpec(
            optim=OptimConfig(lr=2e-2), assert_lag0_exact=True, lora=LoraConfig(rank=4, alpha=8.0)
        ),
        **kw,
    )


class _Killed(Exception):
    """Stands for SIGKILL: the run stops right after a step's metrics row, without its final checkpoint."""


class _KilledAfterRow:
    def __init__(self, inner, step: int) -> None:
        self.inner, self.step = inner, step

    def write(self, step, metrics):
        self.inner.write(step, metrics)
        if step == self.step:
            raise _Killed

    def close(self):
        self.inner.close()


def _state(run) -> dict:
    """What must survive the resume bitwise: weights, fp32 masters, AdamW state, the rewards."""
    learner = run.learner
    return {
        "weights": {k: v.clone() for k, v in run.model.state_dict().items()},
        "masters": [m.clone() for m in learner.masters or []],
        "adamw": learner.optimizer.state_dict()["state"],
        "rewards": [m["reward_mean"] for m in run.history],
        "lag0": [m["lag0_abs_dlogp_max"] for m in run.history],
    }


def _launch(cfg, warm_start=False, die_after_step=None):
    run = LocalRun(cfg)
    if warm_start:  # a base the engine does not build from the config (what a supervised warm start does)
        with torch.no_grad():
            for name, p in run.model.named_parameters():
                if ".lora_" not in name:
                    p.mul_(1.5)
        run.push_model_weights()
    if die_after_step is not None:
        run.writer = _KilledAfterRow(run.writer, die_after_step)
    try:
        try:
            asyncio.run(run.train())
        except _Killed:
            return None
        return _state(run)
    finally:
        run.close()


def test_a_killed_lora_run_resumes_to_the_uninterrupted_runs_bits(tmp_path):
    full = _launch(_cfg(), warm_start=True)
    out = str(tmp_path)
    _launch(_cfg(output_dir=out, checkpoint_every=2), warm_start=True, die_after_step=2)
    resumed = _launch(_cfg(output_dir=out, resume_from=out + "/checkpoint.pt"))
    # (the history holds the steps before the resume too) the same trajectories after the resume
    assert len(resumed["rewards"]) == 4 and resumed["rewards"] == full["rewards"]
    assert resumed["lag0"] == full["lag0"] == [0.0] * 4
    assert set(resumed["weights"]) == set(full["weights"])
    for k, v in full["weights"].items():  # the adapters and the (warm-started, frozen) base
        assert torch.equal(v, resumed["weights"][k]), k
    assert len(full["masters"]) == len(resumed["masters"]) == sum(".lora_" in k for k in full["weights"])
    for a, b in zip(full["masters"], resumed["masters"], strict=True):
        assert a.dtype == torch.float32 and torch.equal(a, b)
    assert full["adamw"].keys() == resumed["adamw"].keys() and len(full["adamw"]) == len(full["masters"])
    for i, per in full["adamw"].items():
        for name, value in per.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(resumed["adamw"][i][name])), (i, name)
    # the adapters trained (B moved off zero)
    assert any(v.abs().sum() > 0 for k, v in full["weights"].items() if ".lora_B." in k)


def test_a_lora_checkpoint_references_the_base_written_once_and_refuses_a_changed_one(tmp_path):
    """The checkpoints' folders hold the adapters' masters and AdamW state only; the (warm-started) base is
    written once into frozen_base/<hash> in the run directory and named by each checkpoint with its SHA-256.
    A base folder whose content changed is refused on resume with one line."""
    import dataclasses

    import pytest
    import torch.distributed.checkpoint as dcp

    from rz_agents.trainer.checkpoint import load_checkpoint

    out = str(tmp_path)
    _launch(dataclasses.replace(_cfg(output_dir=out, checkpoint_every=1), steps=2), warm_start=True)
    bases = list((tmp_path / "frozen_base").iterdir())
    assert len(bases) == 1  # two checkpoints, one base written
    payload = load_checkpoint(tmp_path / "checkpoint.pt", restore_rng=False)
    entry = payload["learner"]["frozen_base"]
    assert entry["dir"] == f"frozen_base/{bases[0].name}" and entry["sha256"].startswith(bases[0].name)
    keys = dcp.FileSystemReader(str(payload["learner_folder"])).read_metadata().state_dict_metadata
    assert keys and all(k.startswith(("masters/", "optimizer/")) and ".lora_" in k for k in keys)
    # Change one base tensor in the folder (a file swapped under the run): the resume refuses it.
    meta = dcp.FileSystemReader(str(bases[0])).read_metadata().state_dict_metadata
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(bases[0])), no_dist=True)
    name = next(k for k in state if k.endswith("q_proj.weight"))
    state[name] = state[name] * 2
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(bases[0])), no_dist=True)
    with pytest.raises(ValueError, match=r"the frozen base changed since the checkpoint was saved"):
        _launch(_cfg(output_dir=out, resume_from=out + "/checkpoint.pt"))
