"""The agent loop with the real engine, a real env and real chat templates: tokens, masks, logprobs."""

import asyncio

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams
from rz_agents.envs.base import MultiTurnTextEnv
from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.logprobs import packed_token_logprobs
from rz_agents.rollout.agent_loop import EpisodeError, EpisodeLimits, EpisodeSpec, run_episode
from rz_agents.rollout.byte_chat import IM_END, ByteChatTemplate, ByteTokenizer
from rz_agents.runtime.synthetic_env import LowercaseLettersEnv


def _engine(vocab=320, seed=0):
    torch.manual_seed(seed)
    model = Transformer(ModelConfig.tiny("qwen3", vocab_size=vocab), kernels="aligned")
    return model, RZEngine(model, EngineConfig(max_running=8, max_len=512))


def _run(engine, env, template, tokenizer, limits, seed=3):
    spec = EpisodeSpec(task=None, group_id=0, member=0, seed=seed)
    return asyncio.run(run_episode(engine, env, template, tokenizer, spec, SamplingParams(), limits))


def test_episode_tokens_are_prompt_turns_and_masked_observations():
    model, engine = _engine()
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    env = LowercaseLettersEnv(max_turns=3)
    traj = _run(
        engine, env, tpl, tok, EpisodeLimits(max_turns=3, max_tokens_per_turn=6, max_episode_tokens=400)
    )
    traj.validate()
    assert traj.info["turns"] == 3
    # The first tokens are exactly the rendered prompt, unmasked.
    messages, info = env.reset(seed=3)
    prompt = tpl.encode_prompt(tok, messages)
    assert traj.tokens[: len(prompt)] == prompt and not any(traj.loss_mask[: len(prompt)])
    # Three sampled runs, separated by unmasked observation tokens that start with the template's delta.
    runs, prev = [], False
    for t, m in enumerate(traj.loss_mask):
        if m and not prev:
            runs.append(t)
        prev = m
    assert len(runs) == 3
    obs = tpl.encode_continuation(tok, [{"role": "user", "content": "More lowercase letters."}])
    for start in runs[1:]:
        assert traj.tokens[start - len(obs) : start] == obs
    # Sampled tokens carry their logprobs and the engine's version; the rest carry -1 / 0.0.
    assert all(v == 0 for v, m in zip(traj.versions, traj.loss_mask, strict=True) if m)
    assert all(
        v == -1 and b == 0.0
        for v, b, m in zip(traj.versions, traj.behavior_logprobs, traj.loss_mask, strict=True)
        if not m
    )
    # Lag 0 in aligned mode: the learner's packed forward reproduces every behavior logprob bit for bit.
    (lp,) = packed_token_logprobs(model, [traj.tokens])
    mask = torch.tensor(traj.loss_mask[1:])
    assert torch.equal(lp.detach()[mask], torch.tensor(traj.behavior_logprobs[1:], dtype=torch.float32)[mask])


def test_cut_off_turn_is_closed_with_an_unmasked_stop_token():
    _, engine = _engine()
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    # One token per turn: the turn is cut off (a random 320-token policy picks <|im_end|> 1 time in 320).
    traj = _run(engine, LowercaseLettersEnv(max_turns=2), tpl, tok, EpisodeLimits(2, 1, 400))
    first = traj.loss_mask.index(True)
    assert traj.tokens[first] != IM_END
    assert traj.tokens[first + 1] == IM_END and not traj.loss_mask[first + 1]
    obs = tpl.encode_continuation(tok, [{"role": "user", "content": "More lowercase letters."}])
    assert traj.tokens[first + 2 : first + 2 + len(obs)] == obs


def test_episode_token_budget_ends_the_episode():
    _, engine = _engine()
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    traj = _run(engine, LowercaseLettersEnv(max_turns=50), tpl, tok, EpisodeLimits(50, 8, 120))
    assert len(traj.tokens) <= 120 + 40  # the last observation may pass the budget; sampling stops
    assert traj.info["finish"] == "max_episode_tokens"


class _BrokenEnv(MultiTurnTextEnv):
    def _reset(self, task, rng):
        return "hello", {"tools": []}

    def _step(self, text):
        raise OSError("tool sandbox died")


def test_env_failure_becomes_an_episode_error():
    _, engine = _engine()
    with pytest.raises(EpisodeError, match="sandbox died"):
        _run(engine, _BrokenEnv(), ByteChatTemplate(), ByteTokenizer(), EpisodeLimits(2, 4, 200))


def test_qwen3_chat_template_and_tokenizer_drive_the_same_loop():
    from rz_agents.model.chat_template import ChatTemplate
    from rz_agents.model.tokenizer import qwen3_tokenizer

    tok = qwen3_tokenizer()
    tpl = ChatTemplate()
    model, engine = _engine(vocab=len(tok))
    env = LowercaseLettersEnv(max_turns=2)
    traj = _run(engine, env, tpl, tok, EpisodeLimits(2, 4, 400))
    traj.validate()
    messages, _ = env.reset(seed=3)
    prompt = tpl.encode_prompt(tok, messages)
    assert traj.tokens[: len(prompt)] == prompt
    (lp,) = packed_token_logprobs(model, [traj.tokens])
    mask = torch.tensor(traj.loss_mask[1:])
    assert torch.equal(lp.detach()[mask], torch.tensor(traj.behavior_logprobs[1:], dtype=torch.float32)[mask])
