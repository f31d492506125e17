"""A multi-turn agent written only against the OpenAI SDK, with a tool, and its scorer (docs/serve.md).

Nothing here knows of rz: ``agent(client, task)`` takes any ``openai.OpenAI`` client. Trained with
``agent: {kind: openai, openai: {function: rz_agents.agents.examples.openai_letters_agent:agent, scorer:
...:score}}`` (configs/openai-agent.yaml), the policy learns what the scorer pays for: lowercase letters in
its replies, a goal a random tiny policy starts far from (~10%) and reaches within a few dozen steps.
``rewriting_agent`` is the same agent with a client habit that breaks token-exactness: it edits the first
message on every turn (a template that rewrites history does the same), which ``rz serve`` counts.
"""

from __future__ import annotations

import string
from typing import Any

MODEL = "policy"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]


def lookup(word: str) -> str:
    """The agent's tool (runs on the client side, as OpenAI tools do)."""
    return f"{word}: a word"


def agent(client, task: dict[str, Any], rewrite_history: bool = False) -> list[str]:
    """Talk for ``task["turns"]`` turns (default 2), answering the model's tool calls; returns its replies."""
    prompt = task.get("prompt", "Write.")
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    replies = []
    for turn in range(int(task.get("turns", 2))):
        if rewrite_history and turn:
            messages[0] = {"role": "user", "content": f"{prompt} (turn {turn})"}
        response = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=16)
        message = response.choices[0].message
        replies.append(message.content or "")
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": lookup(call.function.arguments)}
            )
        if not message.tool_calls:
            messages.append({"role": "user", "content": "Go on."})
    return replies


def rewriting_agent(client, task: dict[str, Any]) -> list[str]:
    """``agent`` with a client that edits an earlier message each turn (not append-only)."""
    return agent(client, task, rewrite_history=True)


def score(task: dict[str, Any], result: list[str] | None, messages: list[dict[str, Any]]) -> float:
    """The share of lowercase letters in the assistant's replies (0 when it wrote nothing)."""
    text = "".join(m.get("content") or "" for m in messages if m["role"] == "assistant")
    return sum(c in string.ascii_lowercase for c in text) / len(text) if text else 0.0
