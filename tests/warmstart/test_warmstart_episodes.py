"""warm_start.episodes: user-given episodes rendered exactly as the rollout renders them.

The reference is the rollout itself: the real agent loop (``run_episode``) plays the episode against the
real env, with an engine that replays the demonstration's assistant turns as its sampled tokens. The
demonstration's tokens must equal the trajectory's token for token, and its loss mask must be the
trajectory's (True on exactly the tokens the policy wrote)."""

import asyncio
import json
import sys
from pathlib import Path

import pytest
import torch

from rz_agents.engine import SamplingParams
from rz_agents.engine.params import Completion
from rz_agents.envs import MultiTurnTextEnv
from rz_agents.envs.tool_calls import parse_tool_calls
from rz_agents.model.chat_template import ChatTemplate
from rz_agents.model.tokenizer import qwen3_tokenizer
from rz_agents.rollout.agent_loop import EpisodeLimits, EpisodeSpec, run_episode
from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer
from rz_agents.warmstart.episodes import EpisodeFileError, assistant_text, load_episodes, render_episode

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial"
sys.path.insert(0, str(TUTORIAL))
from lookup_envs.env import KeyLookupEnv  # noqa: E402


class ReplayEngine:
    """Answers each generate call with the next scripted turn (text tokens + stop), like a policy would."""

    def __init__(self, turns: list[list[int]]) -> None:
        self.turns = list(turns)

    async def generate(self, prompt, params):
        tokens = self.turns.pop(0)
        return Completion(prompt, tokens, torch.zeros(len(tokens)), [0] * len(tokens), "stop")


def _rollout(env, tokenizer, template, episode, task):
    stop = template.stop_token_ids(tokenizer)[0]
    turns = [
        [*tokenizer.encode(assistant_text(m)), stop] for m in episode["messages"] if m["role"] == "assistant"
    ]
    spec = EpisodeSpec(task, 0, 0, seed=1)
    limits = EpisodeLimits(max_turns=4, max_tokens_per_turn=400, max_episode_tokens=4000)
    return asyncio.run(
        run_episode(ReplayEngine(turns), env, template, tokenizer, spec, SamplingParams(), limits)
    )


def _templates():
    yield "byte", ByteTokenizer(), ByteChatTemplate()
    try:
        tok = qwen3_tokenizer()
    except Exception:  # the Qwen3 tokenizer is not cached on this machine
        return
    yield "qwen3", tok, ChatTemplate()


def _task_of(episode, tasks):
    """The task an episode of the tutorial file was recorded on (its key and the code the tool gave)."""
    key = episode["messages"][1]["content"].split()[1]  # the call: "lookup KEY"
    code = episode["messages"][2]["content"]
    return next(t for t in tasks if t["key"] == key and t["code"] == code)


def _tutorial_episodes():
    return [json.loads(line) for line in (TUTORIAL / "episodes.jsonl").read_text().splitlines()[:5]]


@pytest.mark.parametrize(
    "name,tokenizer,template", list(_templates()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_a_tutorial_episode_renders_to_the_rollouts_tokens_and_mask(name, tokenizer, template):
    tasks = [json.loads(line) for line in (TUTORIAL / "tasks.jsonl").read_text().splitlines()]
    for episode in _tutorial_episodes():
        task = _task_of(episode, tasks)
        env = KeyLookupEnv()
        traj = _rollout(env, tokenizer, template, episode, task)
        assert traj.reward == 1.0 and traj.info["turns"] == 2
        _, info = KeyLookupEnv().reset(options={"task": task})
        demo = render_episode(tokenizer, template, episode["messages"], info["tools"])
        assert demo.tokens == traj.tokens
        assert demo.loss_mask == traj.loss_mask
        assert sum(demo.loss_mask) == sum(1 for t in traj.versions if t >= 0)


class HermesLookupEnv(MultiTurnTextEnv):
    """KeyLookup with a JSON-schema tool called in the Hermes format (``parse_tool_calls``)."""

    TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}

    def _reset(self, task, rng):
        self.tools, self.code = [self.TOOL], task["code"]
        return [{"role": "user", "content": f"Code of {task['key']}?"}], {"tools": self.tools}

    def _step(self, text):
        turn = parse_tool_calls(text, self.tools)
        if turn.calls:
            return [{"role": "tool", "content": self.code}], 0.0, False, {}
        return None, float(text.strip() == self.code), True, {}


@pytest.mark.parametrize(
    "name,tokenizer,template", list(_templates()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_openai_style_tool_calls_render_as_the_hermes_text_the_env_parses(name, tokenizer, template):
    task = {"key": "a", "code": "x"}
    messages, info = HermesLookupEnv().reset(options={"task": task})
    call = {"type": "function", "function": {"name": "lookup", "arguments": json.dumps({"key": "a"})}}
    episode = {
        "messages": [
            *messages,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "x"},
            {"role": "assistant", "content": "x"},
        ]
    }
    traj = _rollout(HermesLookupEnv(), tokenizer, template, episode, task)
    assert traj.reward == 1.0 and traj.info["turns"] == 2  # the env parsed the call and answered it
    demo = render_episode(tokenizer, template, episode["messages"], info["tools"])
    assert demo.tokens == traj.tokens and demo.loss_mask == traj.loss_mask and demo.uses_tool


def test_a_wrong_observation_in_the_file_no_longer_matches_the_rollout():
    """Negative control: an episode whose tool result is not what the env returns renders other tokens."""
    tok, template = ByteTokenizer(), ByteChatTemplate()
    episode = _tutorial_episodes()[0]
    tasks = [json.loads(line) for line in (TUTORIAL / "tasks.jsonl").read_text().splitlines()]
    task = _task_of(episode, tasks)
    traj = _rollout(KeyLookupEnv(), tok, template, episode, task)
    bad = json.loads(json.dumps(episode))
    bad["messages"][2]["content"] = "zzz"
    _, info = KeyLookupEnv().reset(options={"task": task})
    assert render_episode(tok, template, bad["messages"], info["tools"]).tokens != traj.tokens


@pytest.mark.parametrize(
    "line,message",
    [
        ("not json", "not JSON"),
        ('{"messages": []}', "no assistant turn"),
        ('{"messages": [{"role": "assistant", "content": "x"}]}', "starts with an assistant turn"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "message 0 needs a role"),
        ("[1, 2]", "expected an object with a 'messages' list"),
    ],
)
def test_a_bad_episodes_file_is_one_line_naming_file_and_line(tmp_path, line, message):
    path = tmp_path / "eps.jsonl"
    good = json.dumps(_tutorial_episodes()[0])
    path.write_text(good + "\n\n" + line + "\n")
    with pytest.raises(EpisodeFileError, match=message) as err:
        load_episodes(path)
    assert f"{path}:3" in str(err.value) and "\n" not in str(err.value)


def test_a_missing_episodes_file_is_named():
    with pytest.raises(EpisodeFileError, match="no file 'nope.jsonl'"):
        load_episodes("nope.jsonl")
