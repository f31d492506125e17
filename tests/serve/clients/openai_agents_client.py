"""The OpenAI Agents SDK with its default model class (the Responses API, ``OpenAIResponsesModel``) against
`rz serve`: a run without tools, the same run streamed, and a run whose agent calls a function tool (a named
tool_choice; the SDK executes the tool, sends its output back and the model answers).

Run by tests/serve/test_serve_client_frameworks.py: ``python openai_agents_client.py SPEC_JSON``; prints one
JSON object with what the client got.
"""

from __future__ import annotations

import asyncio
import json
import sys

from agents import (
    Agent,
    FunctionTool,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from openai.types.responses import ResponseTextDeltaEvent


async def main(spec: dict) -> dict:
    set_tracing_disabled(True)  # no trace export to a remote service
    client = AsyncOpenAI(base_url=spec["base_url"], api_key=spec["api_key"], max_retries=0)
    model = OpenAIResponsesModel(spec["model"], openai_client=client)
    plain = Agent(name="plain", model=model, model_settings=ModelSettings(temperature=0, max_tokens=12))
    chat = await Runner.run(plain, spec["chat_prompt"])
    run = Runner.run_streamed(plain, spec["chat_prompt"])
    pieces = [
        e.data.delta
        async for e in run.stream_events()
        if e.type == "raw_response_event" and isinstance(e.data, ResponseTextDeltaEvent)
    ]
    fn = spec["tool"]["function"]
    calls: list[dict] = []

    async def invoke(ctx, arguments: str) -> str:
        args = json.loads(arguments)
        calls.append({"name": fn["name"], "arguments": args})
        return str(sum(args.values()))

    tool = FunctionTool(
        name=fn["name"], description=fn.get("description", ""), params_json_schema=fn["parameters"],
        on_invoke_tool=invoke, strict_json_schema=False,
    )  # fmt: skip
    # the SDK resets tool_choice after the call (reset_tool_choice), so the model then answers in text
    settings = ModelSettings(temperature=0, max_tokens=80, tool_choice=fn["name"])
    agent = Agent(name="adder", model=model, tools=[tool], model_settings=settings)
    final = await Runner.run(agent, spec["question"], max_turns=3)
    (call,) = calls
    return {"chat": chat.final_output, "streamed": "".join(pieces), "call": call, "final": final.final_output}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
