"""litellm (its OpenAI-compatible provider) against `rz serve`: a chat call, a streamed call and a tool round
trip (a named tool_choice, the call executed here, its result sent back).

Run by tests/serve/test_serve_client_frameworks.py: ``python litellm_client.py SPEC_JSON``; prints one
JSON object with what the client got.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the price list at import

import litellm  # noqa: E402


def main(spec: dict) -> dict:
    kw = {
        "model": f"openai/{spec['model']}",
        "api_base": spec["base_url"],
        "api_key": spec["api_key"],
        "temperature": 0,
        "num_retries": 0,
    }
    tool, name = spec["tool"], spec["tool"]["function"]["name"]
    hello = [{"role": "user", "content": spec["chat_prompt"]}]
    chat = litellm.completion(messages=hello, max_tokens=12, **kw)
    stream = litellm.completion(messages=hello, max_tokens=12, stream=True, **kw)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    messages = [{"role": "user", "content": spec["question"]}]
    first = litellm.completion(
        messages=messages, tools=[tool], max_tokens=80,
        tool_choice={"type": "function", "function": {"name": name}}, **kw,
    )  # fmt: skip
    message = first.choices[0].message
    (call,) = message.tool_calls
    arguments = json.loads(call.function.arguments)
    fn = {"name": call.function.name, "arguments": call.function.arguments}
    messages += [
        {
            "role": "assistant",
            "content": message.content,
            "tool_calls": [{"id": call.id, "type": "function", "function": fn}],
        },
        {"role": "tool", "tool_call_id": call.id, "content": str(sum(arguments.values()))},
    ]
    final = litellm.completion(messages=messages, tools=[tool], max_tokens=40, **kw)
    return {
        "chat": chat.choices[0].message.content,
        "streamed": streamed,
        "call": {"name": call.function.name, "arguments": arguments},
        "final": final.choices[0].message.content,
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
