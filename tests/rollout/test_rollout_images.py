"""Image observations through the agent loop (real engine, tiny model): a text-only template refuses them
by name; a template that renders them gets them with their messages, and the trajectory keeps their
pixels as PNG in order of appearance."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams
from rz_agents.envs.base import MultiTurnTextEnv
from rz_agents.envs.visual_click import VisualClickEnv
from rz_agents.images import content_text, from_png, image_part, message_images, text_part
from rz_agents.model import ModelConfig, Transformer
from rz_agents.rollout.agent_loop import EpisodeError, EpisodeLimits, EpisodeSpec, run_episode
from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer
from rz_agents.trajectory import Trajectory


class ImagePlaceholderTemplate(ByteChatTemplate):
    """The byte template with each image rendered as the text ``<image>`` (a VLM template puts the image's
    placeholder tokens there; the loop only needs to know the template takes images)."""

    renders_images = True

    @staticmethod
    def _flat(messages):
        out = []
        for m in messages:
            if isinstance(m["content"], list):
                text = "".join("<image>" if p["type"] == "image" else p["text"] for p in m["content"])
                m = {"role": m["role"], "content": text}
            out.append(m)
        return out

    def encode_prompt(self, tokenizer, messages, tools=None, enable_thinking=True):
        return super().encode_prompt(tokenizer, self._flat(messages), tools, enable_thinking)

    def encode_continuation(self, tokenizer, new_messages, enable_thinking=True):
        return super().encode_continuation(tokenizer, self._flat(new_messages), enable_thinking)


def _run(template, env, turns=1):
    torch.manual_seed(0)
    engine = RZEngine(
        Transformer(ModelConfig.tiny("qwen3", vocab_size=320)), EngineConfig(max_running=2, max_len=512)
    )
    spec = EpisodeSpec(task=None, group_id=0, member=0, seed=4)
    limits = EpisodeLimits(max_turns=turns, max_tokens_per_turn=4, max_episode_tokens=480)
    return asyncio.run(run_episode(engine, env, template, ByteTokenizer(), spec, SamplingParams(), limits))


def test_a_text_only_template_refuses_image_observations_by_name():
    with pytest.raises(
        EpisodeError, match=r"VisualClickEnv.reset returned 1 image\(s\) but the chat template "
    ):
        _run(ByteChatTemplate(), VisualClickEnv())


def test_the_trajectory_keeps_every_image_as_png_in_order():
    env = VisualClickEnv(max_turns=2)
    traj = _run(ImagePlaceholderTemplate(), env, turns=2)
    traj.validate()
    messages, _ = VisualClickEnv().reset(seed=4)  # the episode's picture (reset seed = the spec's seed)
    (picture,) = message_images(messages)
    assert len(traj.images) == 1 and np.array_equal(np.asarray(from_png(traj.images[0])), picture)
    text = bytes(t for t in traj.tokens if t < 256).decode(errors="replace")
    assert text.count("<image>") == 1 and content_text(messages[1]["content"]) in text
    assert Trajectory.from_dict(traj.to_dict()) == traj


class ShadesEnv(MultiTurnTextEnv):
    """Each observation holds two images, shaded by turn and position: their order is checkable."""

    @staticmethod
    def _obs(turn):
        shades = [np.full((4, 6, 3), 10 * turn + k, np.uint8) for k in range(2)]
        return [{"role": "user", "content": [image_part(shades[0]), text_part("and"), image_part(shades[1])]}]

    def _reset(self, task, rng):
        return self._obs(0), {"task_id": "shades"}

    def _step(self, text):
        return self._obs(self.turn + 1), 0.0, False, {}


def test_images_of_every_turn_are_kept_in_order_of_appearance():
    traj = _run(ImagePlaceholderTemplate(), ShadesEnv(max_turns=3), turns=3)
    # reset + 2 observations rendered (the third step ends the episode: its observation is never rendered)
    shades = [int(np.asarray(from_png(b))[0, 0, 0]) for b in traj.images]
    assert shades == [0, 1, 10, 11, 20, 21] and traj.info["turns"] == 3
