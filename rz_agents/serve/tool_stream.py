"""Tool calls streamed as they are written: a ``tool_calls`` delta with the call's id and name once the model
has written the name, then its ``arguments`` a piece at a time, as OpenAI streams them.

The model writes ``<tool_call>\\n{"name": "N", "arguments": {...}}\\n</tool_call>`` (envs/tool_calls.py). The
arguments streamed are the text the model wrote between ``"arguments": `` and the object's closing brace;
what might still be that brace (or the start of ``</tool_call>``) is held back until the call closes, so the
pieces concatenate to the call's arguments JSON. Only calls to a listed tool are streamed; the rest is left to
the final delta (``OpenAIServer.chat_stream``).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from rz_agents.envs.tool_calls import CLOSE, OPEN

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')


@dataclass
class StreamedCall:
    """A call announced to the client: its id, name and the arguments text sent so far."""

    id: str
    name: str
    sent: str = ""
    closed: bool = False


class ToolCallStream:
    """The ``tool_calls`` deltas of one choice, from its text so far (``update``)."""

    def __init__(self, tool_names: set[str]) -> None:
        self.tool_names = tool_names
        self.calls: list[StreamedCall] = []

    def update(self, text: str) -> list[dict[str, Any]]:
        """The deltas (``{"index", ...}`` entries of ``delta.tool_calls``) that ``text`` adds."""
        out: list[dict[str, Any]] = []
        starts = [m.start() for m in re.finditer(re.escape(OPEN), text)]
        for k, start in enumerate(starts):
            end = starts[k + 1] if k + 1 < len(starts) else len(text)
            body = text[start + len(OPEN) : end]
            if k < len(self.calls):
                call = self.calls[k]
                head = _HEAD.match(body)
            else:
                head = _HEAD.match(body)
                if head is None:
                    break  # the name is not written yet (or this is not a call we stream): later calls wait
                try:
                    name = json.loads(head.group(1))
                except json.JSONDecodeError:
                    break
                if name not in self.tool_names:
                    break
                call = StreamedCall(f"call_{uuid.uuid4().hex[:24]}", name)
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
            piece = self._arguments(body[head.end() :], call)
            if piece:
                call.sent += piece
                out.append({"index": k, "function": {"arguments": piece}})
        return out

    @staticmethod
    def _arguments(region: str, call: StreamedCall) -> str:
        """The arguments text not sent yet (what may be the object's end held back until the call closes)."""
        close = region.find(CLOSE)
        if close >= 0:
            call.closed = True
            region = region[:close]
        else:
            for cut in range(min(len(CLOSE) - 1, len(region)), 0, -1):  # a "</tool_c" may be starting
                if CLOSE.startswith(region[-cut:]):
                    region = region[:-cut]
                    break
        region = region.rstrip("\ufffd").rstrip()  # half a UTF-8 character: wait for the rest
        if region.endswith("}"):  # the call object's closing brace (or, while open, maybe the arguments')
            region = region[:-1].rstrip()
        if not region.startswith(call.sent):
            return ""
        return region[len(call.sent) :]
