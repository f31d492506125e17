"""End to end on pictures: VisualClick-v0 episodes sampled by the real rz engine from a tiny random-init
Qwen3-VL (the byte template renders each picture as <|vision_start|> + one <|image_pad|> per merged patch +
<|vision_end|>, the agent loop sends the pictures with the request), then one learner step on them: every
lag-0 token's log-prob equals the engine's exactly (torch.equal, assert_lag0_exact). Negative control: the
same on the standard op set measures a mismatch."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams
from rz_agents.envs.visual_click import VisualClickEnv
from rz_agents.images import from_png, message_images, to_png
from rz_agents.model.qwen3_vl import Qwen3VLModel, VLSequence, packed_logprobs
from rz_agents.rollout.agent_loop import EpisodeLimits, EpisodeSpec, run_episode
from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer
from rz_agents.rollout.byte_vl_chat import ByteVLChatTemplate
from rz_agents.runtime.factories import policy_template, tiny_vl_config
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig

VISION = {"patch_size": 16, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "depth": 2,
          "deepstack_visual_indexes": [0]}  # fmt: skip


def _model(kernels: str) -> Qwen3VLModel:
    model = Qwen3VLModel(tiny_vl_config({"vocab_size": 320, "vision": VISION}), kernels=kernels)
    model.reset_parameters(seed=3)
    return model


def _episodes(model, n: int = 4):
    template = policy_template(ByteChatTemplate(), model.vl_config)
    engine = RZEngine(
        copy.deepcopy(model).requires_grad_(False), EngineConfig(max_running=4, max_len=320, num_threads=1)
    )
    limits = EpisodeLimits(max_turns=1, max_tokens_per_turn=6, max_episode_tokens=300)

    async def go():
        return await asyncio.gather(*(
            run_episode(
                engine, VisualClickEnv(n_buttons=2), template, ByteTokenizer(),
                EpisodeSpec(task={"split": "train", "index": i // 2}, group_id=i // 2, member=i % 2, seed=i),
                SamplingParams(), limits,
            )
            for i in range(n)
        ))  # fmt: skip

    return template, engine, asyncio.run(go())


def _step(model, trajs, exact: bool) -> dict:
    for t in trajs:  # a reward that differs within each group: the step has a gradient
        t.reward = float(t.info["member"])
    cfg = LearnerConfig(optim=OptimConfig(lr=1e-2, max_grad_norm=1.0), assert_lag0_exact=exact)
    return Learner(model, cfg).step(trajs)


def test_visual_click_episodes_train_with_lag0_exact():
    model = _model("aligned")
    template, engine, trajs = _episodes(model)
    assert isinstance(template, ByteVLChatTemplate) and template.renders_images
    for t in trajs:
        assert len(t.images) == 1 and from_png(t.images[0]).size == (64, 64)
        # 64 px, 16 px patches merged 2x2: one run of 4 placeholders between the vision brackets
        i = t.tokens.index(template.vision_start_id)
        assert t.tokens[i : i + 6] == [template.vision_start_id, *[template.image_token_id] * 4,
                                       template.vision_end_id]  # fmt: skip
        assert t.tokens.count(template.image_token_id) == 4 and sum(t.loss_mask) > 0
    # members of a group see the same picture: the engine encoded each picture once
    assert engine.stats()["images_encoded"] == 2
    before = model.visual.patch_embed.proj.weight.detach().clone()
    metrics = _step(model, trajs, exact=True)
    assert metrics["lag0_abs_dlogp_max"] == 0.0 and metrics["lag0_token_count"] == sum(
        sum(t.loss_mask) for t in trajs
    )
    assert not torch.equal(model.visual.patch_embed.proj.weight, before)  # the tower trained too


def test_negative_control_standard_kernels_measure_a_mismatch():
    model = _model("standard")
    _, _, trajs = _episodes(model)
    metrics = _step(model, trajs, exact=False)
    assert 0.0 < metrics["lag0_abs_dlogp_max"] < 1e-3


def test_a_sampled_image_placeholder_is_an_ordinary_token_to_engine_and_learner():
    """A random policy can sample <|image_pad|>: the engine embeds it as a token (its placeholders are the
    prompt's) and the learner marks only the template's placeholders, so lag-0 log-probs still agree
    exactly. The lm_head row of <|image_pad|> is pointed along task 0's last prompt hidden state, so the
    policy samples the pad first on that picture."""
    model = _model("aligned")
    template = ByteVLChatTemplate(model.vl_config)
    env = VisualClickEnv(n_buttons=2)
    messages, _ = env.reset(seed=0, options={"task": {"split": "train", "index": 0}})
    ids = torch.tensor(template.encode_prompt(ByteTokenizer(), messages))
    request = template.image_prompt([to_png(im) for im in message_images(messages)])
    with torch.no_grad():
        rope, _ = model.rope_positions(ids, request.image_grid_thw)
        images = model.encode_images(request.pixel_values, request.image_grid_thw)
        h = model(ids, torch.arange(len(ids)), rope_positions=rope, images=images)[-1]
        model.lm_head.weight[template.image_token_id] = 40 * h / h.norm()
    _, _, trajs = _episodes(model)
    pad = template.image_token_id
    sampled = [t for t in trajs if any(m and x == pad for x, m in zip(t.tokens, t.loss_mask, strict=True))]
    assert sampled, "no episode sampled the placeholder"
    # negative control: counting every <|image_pad|> as a placeholder (the sampled one too) cannot work
    with pytest.raises(ValueError, match="image"), torch.no_grad():
        packed_logprobs(model, [VLSequence(sampled[0].tokens, request.image_grid_thw, request.pixel_values)])
    metrics = _step(model, trajs, exact=True)
    assert metrics["lag0_abs_dlogp_max"] == 0.0
