"""User-given episodes for a warm start: chat messages rendered exactly as the rollout renders them.

A file of episodes (``warm_start.episodes: PATH``) is JSON Lines, one episode per line::

    {"messages": [{"role": "user", "content": "Reverse: cat"},
                  {"role": "assistant", "content": "<tool_call>{...}</tool_call>"},
                  {"role": "tool", "content": "tac"},
                  {"role": "assistant", "content": "tac"}],
     "tools": [...]}                       # optional: the env's tool schemas (default: the env's own)

The messages are in the env's own format: what its ``reset`` returns, then the policy's turns (the text
the env's ``step`` parses, tool calls included), each followed by the messages its ``step`` returned. An
assistant message may give its calls as OpenAI-style ``tool_calls`` instead; they are written into its
text in the Hermes / Qwen3 form (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``).

Rendering (``render_episode``) makes the calls the agent loop makes: ``encode_prompt`` on the messages
before the first assistant turn (with the tools), then per assistant turn its text's tokens plus the
template's stop token (the loss mask covers these and nothing else), and ``encode_continuation`` on the
messages that follow it, up to the next assistant turn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rz_agents.warmstart.demos import Demonstration

ROLES = ("system", "user", "assistant", "tool")


class EpisodeFileError(ValueError):
    """A line of an episodes file that is not an episode; the message names the file and the line."""


def _tool_call_text(call: Mapping[str, Any]) -> str:
    fn = call.get("function", call)
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ValueError(f"a tool call needs a function name, got {call!r}")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        args = json.loads(args)
    return "<tool_call>" + json.dumps({"name": fn["name"], "arguments": args}) + "</tool_call>"


def assistant_text(message: Mapping[str, Any]) -> str:
    """The text a policy writes for this assistant message: its content, then its ``tool_calls``."""
    parts = [message.get("content") or ""]
    parts += [_tool_call_text(c) for c in message.get("tool_calls") or []]
    return "\n".join(p for p in parts if p)


def check_episode(episode: Any, where: str) -> dict[str, Any]:
    """``episode`` if it is ``{"messages": [...], "tools"?: [...]}`` with at least one assistant turn after a
    prompt; else ValueError naming ``where``."""
    if not isinstance(episode, dict) or not isinstance(episode.get("messages"), list):
        raise EpisodeFileError(
            f"{where}: expected an object with a 'messages' list, got {str(episode)[:80]!r}"
        )
    messages = episode["messages"]
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise EpisodeFileError(f"{where}: message {i} needs a role in {ROLES}, got {str(m)[:80]!r}")
        if m["role"] != "assistant" and not isinstance(m.get("content"), str):
            raise EpisodeFileError(f"{where}: message {i} ({m['role']}) needs a string 'content'")
    roles = [m["role"] for m in messages]
    if "assistant" not in roles:
        raise EpisodeFileError(f"{where}: no assistant turn: nothing to learn from")
    if roles[0] == "assistant":
        raise EpisodeFileError(f"{where}: the episode starts with an assistant turn; give the prompt first")
    tools = episode.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise EpisodeFileError(f"{where}: 'tools' must be a list of tool schemas")
    return episode


def load_episodes(path: str | Path) -> list[dict[str, Any]]:
    """The episodes of a JSON Lines file (blank lines skipped); one-line errors naming the line."""
    p = Path(path)
    if not p.is_file():
        raise EpisodeFileError(f"warm_start.episodes: no file {str(p)!r}")
    episodes = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            episode = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EpisodeFileError(f"{p}:{n}: not JSON ({exc.msg})") from None
        episodes.append(check_episode(episode, f"{p}:{n}"))
    if not episodes:
        raise EpisodeFileError(f"warm_start.episodes: {p} holds no episode")
    return episodes


def render_episode(
    tokenizer: Any,
    template: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> Demonstration:
    """The episode's tokens as the agent loop would hold them, with the loss mask on assistant tokens."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    tokens = list(template.encode_prompt(tokenizer, list(messages[:first]), tools=tools or None))
    mask = [False] * len(tokens)
    stop = template.stop_token_ids(tokenizer)[0]
    i, uses_tool = first, False
    while i < len(messages):
        text = assistant_text(messages[i])
        uses_tool = uses_tool or "<tool_call>" in text
        sampled = [*tokenizer.encode(text), stop]
        tokens += sampled
        mask += [True] * len(sampled)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        observation = [dict(m) for m in messages[i + 1 : j]]
        if j < len(messages):  # the env answered and the policy speaks again
            cont = list(template.encode_continuation(tokenizer, observation))
            tokens += cont
            mask += [False] * len(cont)
        i = j
    return Demonstration(tokens, mask, uses_tool)
