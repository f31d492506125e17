"""LangChain's ChatOpenAI against `rz serve`: a chat call, a streamed call and a tool round trip (bind_tools
with a named tool_choice, the call executed here, a ToolMessage back).

Run by tests/serve/test_serve_client_frameworks.py: ``python langchain_client.py SPEC_JSON``; prints one
JSON object with what the client got.
"""

from __future__ import annotations

import json
import sys

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI


def main(spec: dict) -> dict:
    llm = ChatOpenAI(
        model=spec["model"], base_url=spec["base_url"], api_key=spec["api_key"], temperature=0,
        max_tokens=40, max_retries=0,
    )  # fmt: skip
    tool, name = spec["tool"], spec["tool"]["function"]["name"]
    chat = llm.invoke([HumanMessage(spec["chat_prompt"])], max_tokens=12)
    streamed = "".join(str(piece.content) for piece in llm.stream([HumanMessage(spec["chat_prompt"])],
                                                                  max_tokens=12))  # fmt: skip
    messages = [HumanMessage(spec["question"])]
    first = llm.bind_tools([tool], tool_choice=name).invoke(messages, max_tokens=80)
    (call,) = first.tool_calls
    messages += [first, ToolMessage(str(sum(call["args"].values())), tool_call_id=call["id"])]
    final = llm.bind_tools([tool]).invoke(messages)
    return {
        "chat": chat.content,
        "streamed": streamed,
        "call": {"name": call["name"], "arguments": call["args"]},
        "final": final.content,
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
