"""Qwen3.5's XML tool calls streamed as they are written, as OpenAI streams calls: a ``tool_calls`` delta with
the call's id and name once ``<function=NAME>`` is written, then its ``arguments`` as JSON, one piece per
parameter the model has closed (``<parameter=KEY>\\nVALUE\\n</parameter>``), and the closing brace with
``</function>``.

A value is read by its parameter's schema type, exactly as the non-streamed reply reads it
(``rz_agents.envs.xml_tool_calls.typed_value``), so the pieces concatenate to the arguments JSON of the
non-streamed reply (``json.dumps(arguments, ensure_ascii=False)``). A value that does not fit its type stops
that call's stream: what the call is becomes the final delta's business (``OpenAIServer.chat_stream``). Only
calls to a listed tool are streamed.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from rz_agents.envs.tool_call_types import tool_names
from rz_agents.envs.tool_calls import OPEN
from rz_agents.envs.xml_tool_calls import typed_value
from rz_agents.serve.tool_stream import StreamedCall

_FUNCTION_HEAD = re.compile(r"\s*<function=([^>\n]*)>")
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]*)>(.*?)</parameter>", re.DOTALL)
_FUNCTION_CLOSE = "</function>"


def _value_text(text: str) -> str:
    """The value as the template writes it on its own line (one newline each side dropped)."""
    text = text[1:] if text.startswith("\n") else text
    return text[:-1] if text.endswith("\n") else text


class XmlCallStream:
    """The ``tool_calls`` deltas of one choice in the XML form, from its text so far (``update``)."""

    def __init__(self, tools: list[dict[str, Any]]) -> None:
        self.schemas = tool_names(tools)
        self.calls: list[StreamedCall] = []

    def update(self, text: str) -> list[dict[str, Any]]:
        """The deltas (``{"index", ...}`` entries of ``delta.tool_calls``) that ``text`` adds."""
        out: list[dict[str, Any]] = []
        starts = [m.start() for m in re.finditer(re.escape(OPEN), text)]
        for k, start in enumerate(starts):
            end = starts[k + 1] if k + 1 < len(starts) else len(text)
            body = text[start + len(OPEN) : end]
            head = _FUNCTION_HEAD.match(body)
            if head is None:
                break  # the name is not written yet (">" ends it): later calls wait
            if k == len(self.calls):
                name = head.group(1).strip()
                if name not in self.schemas:
                    break
                self.calls.append(StreamedCall(f"call_{uuid.uuid4().hex[:24]}", name))
                out.append(
                    {"index": k, "id": self.calls[k].id, "type": "function",
                     "function": {"name": name, "arguments": ""}}
                )  # fmt: skip
            call = self.calls[k]
            if call.closed:
                continue
            written = self._arguments(body[head.end() :], call)
            if written.startswith(call.sent) and len(written) > len(call.sent):
                out.append({"index": k, "function": {"arguments": written[len(call.sent) :]}})
                call.sent = written
        return out

    def _arguments(self, inner: str, call: StreamedCall) -> str:
        """The arguments JSON the closed parameters make (with ``}`` once ``</function>`` is written)."""
        schema = self.schemas[call.name]
        pieces: list[str] = []
        pos = 0
        while (param := _PARAMETER.match(inner, pos)) is not None:
            key = param.group(1).strip()
            value, problem = typed_value(call.name, key, _value_text(param.group(2)), schema)
            if problem:
                call.closed = True  # not a call the stream can tell: the final delta has it
                return call.sent
            pieces.append(f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}")
            pos = param.end()
        written = "{" + ", ".join(pieces) if pieces else ""
        if inner[pos:].lstrip().startswith(_FUNCTION_CLOSE):
            call.closed = True
            written = (written or "{") + "}"
        return written
