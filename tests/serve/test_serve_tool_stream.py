"""Tool calls streamed as written: fed a reply a character at a time, ``ToolCallStream`` announces each call's
id and name once, and its argument pieces concatenate to exactly the arguments the model wrote, whatever
brace or partial ``</tool_call>`` the text ended on at each step."""

from __future__ import annotations

import json

from rz_agents.serve.tool_stream import ToolCallStream

REPLY = (
    'Let me add.<tool_call>\n{"name": "add", "arguments": {"a": {"x": 1}, "b": "}é"}}\n</tool_call>'
    '<tool_call>\n{"name": "mul", "arguments": {"c": 3}}\n</tool_call>'
    '<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>'
)


def _feed(text: str, names: set[str]) -> list[dict]:
    stream, out = ToolCallStream(names), []
    for end in range(1, len(text) + 1):
        out += stream.update(text[:end])
    return out


def test_calls_stream_their_name_once_and_their_arguments_in_pieces():
    deltas = _feed(REPLY, {"add", "mul"})
    by_index: dict[int, list[dict]] = {}
    for d in deltas:
        by_index.setdefault(d["index"], []).append(d)
    assert sorted(by_index) == [
        0,
        1,
    ]  # "rm" is not a listed tool: left to the final delta, and so what follows
    for k, (name, arguments) in enumerate([("add", {"a": {"x": 1}, "b": "}é"}), ("mul", {"c": 3})]):
        head, *pieces = by_index[k]
        assert head["function"]["name"] == name and head["id"].startswith("call_")
        text = "".join(p["function"]["arguments"] for p in pieces)
        assert len(pieces) > 3 and json.loads(text) == arguments


def test_nothing_is_streamed_before_the_name_is_written():
    assert _feed('<tool_call>\n{"name": "ad', {"add"}) == []
    assert _feed('<tool_call>\n{"name": "add", "arguments": ', {"add"})[0]["function"] == {
        "name": "add",
        "arguments": "",
    }
