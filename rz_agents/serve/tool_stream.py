"""Tool calls streamed as they are written: a ``tool_calls`` delta with the call's id and name once the model
has written the name, then its ``arguments`` a piece at a time, as OpenAI streams them.

The model writes ``<tool_call>\\n{"name": "N", "arguments": {...}}\\n</tool_call>`` (envs/tool_calls.py). The
arguments streamed are the text the model wrote between ``"arguments": `` and the object's closing brace;
what might still be that brace (or the start of ``</tool_call>``) is held back until the call closes, so the
pieces concatenate to the call's arguments JSON. Only calls to a listed tool are streamed; the rest is left to
the final delta (``OpenAIServer.chat_stream``).

Kimi's format (``<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>``)
streams the same way (``kimi_call_stream``): its arguments are the whole JSON object the model wrote, and the
call's id is the one the model wrote, as in the non-streamed reply. Qwen3.5's XML form is
``xml_tool_stream.py``.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rz_agents.envs.kimi_tool_calls import tool_name
from rz_agents.envs.tool_calls import CLOSE, OPEN
from rz_agents.kimi_tokens import TOOL_CALL_ARGUMENT_BEGIN, TOOL_CALL_BEGIN, TOOL_CALL_END

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')
_KIMI_HEAD = re.compile(r"\s*([^<]*?)" + re.escape(TOOL_CALL_ARGUMENT_BEGIN))

# A call's head: (name, id or None for a fresh one, where its arguments start), or None while not written
Head = Callable[[str], "tuple[str, str | None, int] | None"]


def json_head(body: str) -> tuple[str, str | None, int] | None:
    """The head ``{"name": "N", "arguments": `` of a JSON call (its name; a fresh id)."""
    head = _HEAD.match(body)
    if head is None:
        return None
    try:
        return json.loads(head.group(1)), None, head.end()
    except json.JSONDecodeError:
        return None


def kimi_head(body: str) -> tuple[str, str | None, int] | None:
    """The head ``functions.NAME:IDX<|tool_call_argument_begin|>`` of a Kimi call (the id is the model's)."""
    head = _KIMI_HEAD.match(body)
    if head is None:
        return None
    return tool_name(head.group(1)), head.group(1).strip(), head.end()


@dataclass
class StreamedCall:
    """A call announced to the client: its id, name and the arguments text sent so far."""

    id: str
    name: str
    sent: str = ""
    closed: bool = False


class ToolCallStream:
    """The ``tool_calls`` deltas of one choice, from its text so far (``update``).

    Args:
        tool_names: the listed tools (a call of another is not streamed).
        open_tag, close_tag, head: where a call starts and ends, and how its head reads (``json_head``).
        object_closes: True when the call's own object closes after the arguments (the JSON form's ``}``,
            held back); False when the arguments run to the close tag (Kimi's).
    """

    def __init__(
        self,
        tool_names: set[str],
        open_tag: str = OPEN,
        close_tag: str = CLOSE,
        head: Head = json_head,
        object_closes: bool = True,
    ) -> None:
        self.tool_names = tool_names
        self.open_tag, self.close_tag, self.head = open_tag, close_tag, head
        self.object_closes = object_closes
        self.calls: list[StreamedCall] = []

    def update(self, text: str) -> list[dict[str, Any]]:
        """The deltas (``{"index", ...}`` entries of ``delta.tool_calls``) that ``text`` adds."""
        out: list[dict[str, Any]] = []
        starts = [m.start() for m in re.finditer(re.escape(self.open_tag), text)]
        for k, start in enumerate(starts):
            end = starts[k + 1] if k + 1 < len(starts) else len(text)
            body = text[start + len(self.open_tag) : end]
            head = self.head(body)
            if k < len(self.calls):
                call = self.calls[k]
            else:
                if head is None:
                    break  # the name is not written yet (or this is not a call we stream): later calls wait
                name, call_id = head[0], head[1]
                if name not in self.tool_names:
                    break
                call = StreamedCall(call_id or f"call_{uuid.uuid4().hex[:24]}", name)
                self.calls.append(call)
                out.append(
                    {
                        "index": k,
                        "id": call.id,
                        "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }
                )
            if head is None or call.closed:
                continue
            piece = self._arguments(body[head[2] :], call)
            if piece:
                call.sent += piece
                out.append({"index": k, "function": {"arguments": piece}})
        return out

    def _arguments(self, region: str, call: StreamedCall) -> str:
        """The arguments text not sent yet (what may be the object's end held back until the call closes)."""
        close_tag = self.close_tag
        close = region.find(close_tag)
        if close >= 0:
            call.closed = True
            region = region[:close]
        else:
            for cut in range(min(len(close_tag) - 1, len(region)), 0, -1):  # a "</tool_c" may be starting
                if close_tag.startswith(region[-cut:]):
                    region = region[:-cut]
                    break
        region = region.rstrip("\ufffd").rstrip()  # half a UTF-8 character: wait for the rest
        if self.object_closes and region.endswith("}"):  # the call object's brace (or maybe the arguments')
            region = region[:-1].rstrip()
        if not region.startswith(call.sent):
            return ""
        return region[len(call.sent) :]


def kimi_call_stream(tool_names: set[str]) -> ToolCallStream:
    """The stream of Kimi's calls (``<|tool_call_begin|>...<|tool_call_end|>``; the model's call ids)."""
    return ToolCallStream(tool_names, TOOL_CALL_BEGIN, TOOL_CALL_END, kimi_head, object_closes=False)
