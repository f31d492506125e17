"""learner.freeze_vision publishes the trained part only: the vision tower of a Qwen3-VL policy never changes,
so after the engine holds it (built from the same weights, or sent whole once) each weight update carries
every tensor but the tower, plus the SHA-256 of the tower it leaves out (model/held_weights.py), which the
engine checks. Over three learner steps synced that way the engine's log-probs of sampled image episodes equal
the learner's bit for bit (torch.equal); negative control: one stale language-model tensor on the engine
makes them differ. Misuse is refused: an engine whose tower differs, a learner whose frozen tower changed."""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest
import torch

from rz_agents.engine import EngineConfig, ImagePrompt, RZEngine, SamplingParams
from rz_agents.images import to_png
from rz_agents.model.freeze import freeze_vision_tower
from rz_agents.model.held_weights import HELD_KEY
from rz_agents.model.qwen3_vl import Qwen3VLModel
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig
from rz_agents.model.vl_processor import png_image_inputs
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig
from rz_agents.trainer.sequence_logprobs import trajectory_logprobs
from rz_agents.trajectory import Trajectory

IMG, START, END = 300, 302, 303
TOWER = "model.visual."


def _pair(freeze: bool = True) -> tuple[Learner, RZEngine]:
    """A learner over a tiny random Qwen3-VL and an engine over its own copy (as the local runtime wires
    them: the engine starts from the same weights)."""
    model = Qwen3VLModel(Qwen3VLConfig.tiny(vocab_size=320), kernels="aligned")
    model.reset_parameters(std=0.1, seed=4)
    cfg = LearnerConfig(
        optim=OptimConfig(lr=1e-2, max_grad_norm=1.0), assert_lag0_exact=True, freeze_vision=freeze
    )
    if freeze:  # as model.policy.build_policy does for PolicySpec.freeze_vision
        freeze_vision_tower(model)
    learner = Learner(model, cfg)
    engine_model = copy.deepcopy(model).requires_grad_(False)
    engine_cfg = EngineConfig(max_running=4, max_len=96, max_batch_tokens=12, num_threads=1)
    return learner, RZEngine(engine_model, engine_cfg)


def _episodes(engine: RZEngine, seed: int) -> list[Trajectory]:
    """Two prompts with one image each, two samples per prompt, sampled by ``engine``."""
    rng = np.random.default_rng(seed)
    vision = engine.model.vl_config.vision
    reqs = []
    for gi, (h, w) in enumerate([(48, 80), (64, 64)]):
        png = to_png(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        pixels, grids = png_image_inputs([png], vision)
        prompt = [5 + gi, 6, START] + [IMG] * (int(grids.prod()) // 4) + [END, 9]
        for j in range(2):
            params = SamplingParams(max_tokens=5, seed=100 * seed + 10 * gi + j)
            reqs.append((gi, prompt, ImagePrompt(pixels, grids), png, params))

    async def go():
        return await asyncio.gather(*(engine.generate(p, sp, images=im) for _, p, im, _, sp in reqs))

    trajs = []
    for (gi, prompt, _, png, _), out in zip(reqs, asyncio.run(go()), strict=True):
        n = len(out.tokens)
        trajs.append(
            Trajectory(
                prompt + out.tokens, [False] * len(prompt) + [True] * n,
                [0.0] * len(prompt) + out.logprobs.tolist(), [-1] * len(prompt) + out.versions,
                float(sum(t % 2 == 0 for t in out.tokens)), gi, images=[png],
            )
        )  # fmt: skip
    return trajs


def _sampled_logprobs(learner: Learner, trajs: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the engine's behavior log-probs, the learner's log-probs) of every sampled token of ``trajs``."""
    with torch.no_grad():
        scored = trajectory_logprobs(learner.model, trajs, {})
    engine_lp, learner_lp = [], []
    for t, lp in zip(trajs, scored, strict=True):
        mask = torch.tensor(t.loss_mask[1:])
        engine_lp.append(torch.tensor(t.behavior_logprobs[1:], dtype=torch.float32)[mask])
        learner_lp.append(lp[mask])
    return torch.cat(engine_lp), torch.cat(learner_lp)


def _nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def test_frozen_tower_is_never_resent_and_engine_logprobs_stay_bit_identical():
    learner, engine = _pair()
    full = _nbytes(learner.weights())
    tower = _nbytes({k: v for k, v in learner.weights().items() if k.startswith(TOWER)})
    # the engine was built from the same weights: it holds the tower already, the first update can be partial
    engine.load_weights(learner.published_weights(), learner.version)
    for step in range(3):
        trajs = _episodes(engine, seed=step)
        assert len({t.reward for t in trajs}) > 1  # a non-zero advantage: the step changes the weights
        metrics = learner.step(trajs)  # (assert_lag0_exact: raises on any lag-0 mismatch)
        assert metrics["lag0_token_count"] > 0 and metrics["lag0_abs_dlogp_max"] == 0.0
        published = learner.published_weights()
        assert not [k for k in published if k.startswith(TOWER)] and HELD_KEY in published
        assert _nbytes(published) == full - tower + 32  # everything but the tower, and the 32-byte claim
        engine.load_weights(published, learner.version)
    assert engine.version == learner.version == 3
    engine_state, learner_state = engine.model.state_dict(), learner.model.state_dict()
    assert all(torch.equal(engine_state[k], v) for k, v in learner_state.items())
    # the engine samples image episodes with version 3; the learner scores them: bit-identical
    trajs = _episodes(engine, seed=7)
    assert {v for t in trajs for v, m in zip(t.versions, t.loss_mask, strict=True) if m} == {3}
    sampled, scored = _sampled_logprobs(learner, trajs)
    assert sampled.numel() > 0 and torch.equal(sampled, scored)
    # negative control: one language-model tensor left stale on the engine (an unsent non-tower weight)
    name = "model.language_model.layers.0.mlp.down_proj.weight"
    assert name in published
    engine.load_weights({name: learner_state[name] + 1e-2}, learner.version)
    sampled, scored = _sampled_logprobs(learner, _episodes(engine, seed=7))
    assert not torch.equal(sampled, scored)


def test_a_partial_update_is_refused_by_an_engine_whose_tower_differs():
    learner, engine = _pair()
    with torch.no_grad():  # this engine's tower is not the learner's (built otherwise, or changed)
        engine.model.visual.patch_embed.proj.weight.add_(1e-3)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    with pytest.raises(ValueError, match="partial update .* load the whole weights first"):
        engine.load_weights(learner.published_weights(), 1)
    after = engine.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items()) and engine.version == 0  # nothing loaded
    engine.load_weights(learner.weights(), 1)  # the whole weights (the runtimes' load_engine_base)
    engine.load_weights(learner.published_weights(), 2)  # then partial updates are accepted
    assert engine.version == 2


def test_a_changed_frozen_tower_changes_the_claim_and_needs_the_whole_weights():
    """A warm start or a resumed checkpoint with another tower (learner.replace_weights): the learner's claim
    follows its tower, so the engine refuses the next partial update until it got the whole weights."""
    learner, engine = _pair()
    engine.load_weights(learner.published_weights(), 0)
    weights = {k: v.clone() for k, v in learner.weights().items()}
    weights["model.visual.patch_embed.proj.weight"] += 1e-3
    learner.replace_weights(weights)
    with pytest.raises(ValueError, match="partial update"):
        engine.load_weights(learner.published_weights(), 0)
    engine.load_weights(learner.weights(), 0)
    engine.load_weights(learner.published_weights(), 0)
    tower_weight = learner.model.visual.patch_embed.proj.weight
    assert torch.equal(engine.model.visual.patch_embed.proj.weight, tower_weight)


def test_without_freeze_vision_every_update_is_whole():
    learner, _ = _pair(freeze=False)
    assert learner.published_names() is None
    published = learner.published_weights()
    assert HELD_KEY not in published and sorted(published) == sorted(learner.weights())
