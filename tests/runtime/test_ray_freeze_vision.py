"""learner.freeze_vision on the Ray runtime (the shared two-node test cluster, conftest.py): the tiny Qwen3-VL
policy of the visual-click demo, whose vision tower never changes, so a weight update publishes every tensor
but the tower (and the 32-byte claim on it that the engines check: model/held_weights.py), through the object
store or by broadcast to two engines. In sync mode trajectories, losses and the final weights are the local
run's bit for bit, every lag-0 token scores exactly (assert_lag0_exact), and each update's bytes are the whole
weights' less the tower's. A tower changed in the driver (a warm start) reaches the engines once, whole."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rz_agents.cli.train import load_run_config
from rz_agents.runtime import ActorsConfig, build_run
from tests.runtime.test_ray_lora import train_recorded

ray = pytest.importorskip("ray")

TOWER = "model.visual."
OVERRIDES = [
    "mode=sync", "steps=3", "seed=5", "num_threads=1", "eval.every=0",
    "rollout.group_size=2", "rollout.groups_per_batch=2", "rollout.max_concurrent_episodes=4",
    "learner.freeze_vision=true", "learner.assert_lag0_exact=true", "learner.optim.lr=0.01",
]  # fmt: skip


def _cfg(runtime: str = "ray", actors: ActorsConfig | None = None):
    cfg = load_run_config("visual-click-demo", [*OVERRIDES, f"runtime={runtime}"])
    return dataclasses.replace(cfg, actors=actors or ActorsConfig()) if runtime == "ray" else cfg


def _train(run):
    """``train_recorded``, then the run closed."""
    try:
        return train_recorded(run)
    finally:
        run.close()


@pytest.fixture(scope="module")
def local_run():
    run = build_run(_cfg(runtime="local"))
    batches, weights = _train(run)
    return run.history, batches, weights


def _bytes(weights, tower: bool) -> int:
    return sum(v.numel() * v.element_size() for k, v in weights.items() if k.startswith(TOWER) or not tower)


def _check(history, batches, weights, local_run) -> None:
    local_history, local_batches, local_weights = local_run
    assert batches == local_batches
    assert set(weights) == set(local_weights)
    for k, v in weights.items():
        assert torch.equal(v, local_weights[k]), k
    full, tower = _bytes(weights, tower=False), _bytes(weights, tower=True)
    assert tower > 0
    for step, (mine, theirs) in enumerate(zip(history, local_history, strict=True)):
        assert mine["loss"] == theirs["loss"]
        assert mine["lag0_abs_dlogp_max"] == 0.0 and mine["lag0_token_count"] > 0
        assert mine["engine_version"] == step + 1
        # everything but the tower (and the claim on it), in both runtimes
        assert mine["weight_update_bytes"] == theirs["weight_update_bytes"] == full - tower + 32


def test_ray_freeze_vision_through_the_object_store_equals_the_local_run(ray_cluster, local_run):
    run = build_run(_cfg())
    published = dict(ray.get(run.learner.weights_ref()).tensors)
    assert published and not [k for k in published if k.startswith(TOWER)]
    batches, weights = _train(run)
    _check(run.history, batches, weights, local_run)
    assert run.publications == {"broadcast": 0, "object_store": 3}


def test_ray_freeze_vision_by_broadcast_to_two_engines_after_a_changed_tower(ray_cluster, local_run):
    """A tower changed in the driver (as a warm start would) goes to both engines once, whole; then the
    broadcasts leave it out. Were it not sent, the engines' partial updates would be refused (their tower
    differs from the learner's claim); were it sent stale, lag-0 tokens would not score exactly."""
    actors = ActorsConfig(engines=2, env_workers=1, weight_transport="broadcast")
    run = build_run(_cfg(actors=actors))
    with torch.no_grad():
        run.model.visual.patch_embed.proj.weight.mul_(1.25)
    run.push_model_weights()
    whole = run.learner.full_weights()
    name = "model.visual.patch_embed.proj.weight"
    assert torch.equal(whole[name], run.model.state_dict()[name])
    _, weights = _train(run)
    assert run.publications == {"broadcast": 3, "object_store": 0}
    full, tower = _bytes(weights, tower=False), _bytes(weights, tower=True)
    for m in run.history:
        assert m["lag0_abs_dlogp_max"] == 0.0 and m["lag0_token_count"] > 0
        assert m["weight_update_bytes"] == full - tower + 32
    assert torch.equal(weights[name], whole[name])  # frozen: still the driver's changed tower
