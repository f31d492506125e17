"""The openai SDK (the clients venv's version) against `rz serve`: a chat call, a streamed call and a tool
round trip (a named tool_choice, the call executed here, its result sent back).

Run by tests/serve/test_serve_client_frameworks.py: ``python openai_sdk_client.py SPEC_JSON``; prints one
JSON object with what the client got.
"""

from __future__ import annotations

import json
import sys

import openai


def main(spec: dict) -> dict:
    client = openai.OpenAI(base_url=spec["base_url"], api_key=spec["api_key"], max_retries=0)
    model, tool, name = spec["model"], spec["tool"], spec["tool"]["function"]["name"]
    hello = [{"role": "user", "content": spec["chat_prompt"]}]
    chat = client.chat.completions.create(model=model, messages=hello, temperature=0, max_tokens=12)
    stream = client.chat.completions.create(
        model=model, messages=hello, temperature=0, max_tokens=12, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    messages = [{"role": "user", "content": spec["question"]}]
    first = client.chat.completions.create(
        model=model, messages=messages, tools=[tool], temperature=0, max_tokens=80,
        tool_choice={"type": "function", "function": {"name": name}},
    )  # fmt: skip
    message = first.choices[0].message
    (call,) = message.tool_calls
    arguments = json.loads(call.function.arguments)
    messages += [
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": str(sum(arguments.values()))},
    ]
    final = client.chat.completions.create(
        model=model, messages=messages, tools=[tool], temperature=0, max_tokens=40
    )
    return {
        "chat": chat.choices[0].message.content,
        "streamed": streamed,
        "call": {"name": call.function.name, "arguments": arguments},
        "final": final.choices[0].message.content,
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
