"""smolagents against `rz serve`: its OpenAI model class for a chat call and a streamed call, and its
ToolCallingAgent (tool_choice "required", what it always sends) for a tool round trip: the model calls the
tool, the agent runs it and sends the observation back, and the model ends with smolagents' final_answer
tool.

Run by tests/serve/test_serve_client_frameworks.py: ``python smolagents_client.py SPEC_JSON``; prints one
JSON object with what the client got.
"""

from __future__ import annotations

import importlib.resources
import json
import sys

import yaml
from smolagents import OpenAIServerModel, Tool, ToolCallingAgent
from smolagents.models import ChatMessage


def _tool(spec: dict, calls: list[dict]) -> Tool:
    fn = spec["tool"]["function"]
    inputs = {k: {"type": v["type"], "description": k} for k, v in fn["parameters"]["properties"].items()}

    class Called(Tool):
        name = fn["name"]
        description = fn["description"]
        output_type = "string"
        skip_forward_signature_validation = True  # forward takes the spec's arguments as keywords

        def forward(self, **arguments) -> str:
            calls.append({"name": fn["name"], "arguments": arguments})
            return str(sum(arguments.values()))

    Called.inputs = inputs
    return Called()


def main(spec: dict) -> dict:
    model = OpenAIServerModel(
        model_id=spec["model"], api_base=spec["base_url"], api_key=spec["api_key"], temperature=0,
        max_tokens=80, client_kwargs={"max_retries": 0},
    )  # fmt: skip
    hello = [ChatMessage(role="user", content=[{"type": "text", "text": spec["chat_prompt"]}])]
    chat = model.generate(hello)
    streamed = "".join(d.content or "" for d in model.generate_stream(hello))
    calls: list[dict] = []
    templates = yaml.safe_load(
        importlib.resources.files("smolagents.prompts").joinpath("toolcalling_agent.yaml").read_text()
    )
    templates["system_prompt"] = spec.get("system_prompt", "")  # the tiny policy's context is short
    agent = ToolCallingAgent(
        tools=[_tool(spec, calls)], model=model, prompt_templates=templates, max_steps=3, verbosity_level=0
    )
    final = agent.run(spec["question"])
    (call,) = calls
    return {"chat": chat.content, "streamed": streamed, "call": call, "final": final}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
