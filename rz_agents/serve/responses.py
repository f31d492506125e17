"""OpenAI's Responses API (``POST /v1/responses``) as a translation to and from chat completions.

The request's ``instructions`` and ``input`` items become chat messages (a message, the ``function_call``
items that follow an assistant message as its ``tool_calls``, a ``function_call_output`` as a tool
message), its flat function tools become chat tools; the chat request then runs exactly as on
``/v1/chat/completions``, sessions included (the same header, ``metadata.rz_session`` or
``/sessions/ID/v1/responses``), so a conversation has the same tokens through either API. The reply's
message and tool calls become ``output`` items; a stream is the Responses event sequence (``response.created``
... ``response.output_text.delta`` ... ``response.function_call_arguments.delta`` ... ``response.completed``
or, cut at max_output_tokens, ``response.incomplete``),
sent as the model writes: a call's item as soon as its name is written, its arguments a piece at a time.

Not served (400): ``previous_response_id`` (responses are not stored: send the whole input, or use a
session), non-function tools, input items other than messages and function calls / outputs, images other
than ``input_image`` data URIs (a vision-language policy only).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from rz_agents.serve.openai_schema import OpenAIError

_FIELDS = {
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
    "temperature", "top_p", "top_k", "seed", "stream", "metadata", "store", "user", "text", "truncation",
    "include", "reasoning", "previous_response_id", "service_tier", "top_logprobs", "stream_options",
    "prompt_cache_key", "safety_identifier", "background", "max_tool_calls",
}  # fmt: skip
_PASSED = ("model", "temperature", "top_p", "top_k", "seed", "metadata", "parallel_tool_calls", "stream")


def _fail(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(message, param)


def chat_body(body: Any) -> dict[str, Any]:
    """The ``/v1/chat/completions`` body a Responses request asks for (unknown fields are left for the chat
    parser to warn about or refuse)."""
    if not isinstance(body, dict):
        raise _fail(f"the request body must be a JSON object, got {type(body).__name__}")
    if body.get("previous_response_id") is not None:
        raise _fail(
            "'previous_response_id' is not supported: rz serve does not store responses; send the whole "
            "input (or name a session)",
            "previous_response_id",
        )
    if body.get("background"):
        raise _fail("'background' is not supported", "background")
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise _fail("'text.format' other than {'type': 'text'} is not supported", "text")
    chat: dict[str, Any] = {k: body[k] for k in _PASSED if k in body}
    chat.update({k: v for k, v in body.items() if k not in _FIELDS})  # unknown: the chat parser's call
    messages = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _fail("'instructions' must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    messages += input_messages(body.get("input"))
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    choice = body.get("tool_choice")
    if choice is not None:
        if isinstance(choice, dict) and choice.get("type") == "function":
            choice = {"type": "function", "function": {"name": choice.get("name")}}
        chat["tool_choice"] = choice
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise _fail("'stream_options' must be an object", "stream_options")
    return chat


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _fail("'tools' must be a list", "tools")
    out = []
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise _fail(f"tools[{k}]: only function tools are served, got {kind!r}", f"tools[{k}]")
        fn = {key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _content(content: Any, where: str) -> str | list[dict[str, Any]] | None:
    """A message's content for the chat request: text parts joined, or with ``input_image`` parts (data URIs)
    a list of chat text and ``image_url`` parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[dict[str, Any]] = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind in ("input_text", "output_text", "text"):
                if not isinstance(part.get("text"), str):
                    raise _fail(f"{where}: a text part needs 'text'", where)
                parts.append({"type": "text", "text": part["text"]})
            elif kind == "input_image" and isinstance(part.get("image_url"), str):
                parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
            else:
                raise _fail(
                    f"{where}: only text and input_image parts (with an image_url) are supported, got a "
                    f"{kind!r} part",
                    where,
                )
        if all(p["type"] == "text" for p in parts):
            return "".join(p["text"] for p in parts)
        return parts
    raise _fail(f"{where} must be a string or a list of content parts", where)


def _text(content: Any, where: str) -> str:
    """A tool output's text (text parts only)."""
    text = _content(content, where)
    if not isinstance(text, str):
        raise _fail(f"{where}: only text parts are supported", where)
    return text


def input_messages(items: Any) -> list[dict[str, Any]]:
    """Chat messages from a Responses ``input`` (a string, or a list of items)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise _fail("'input' must be a string or a non-empty list of items", "input")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _fail(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item.get("role"), "content": _content(item.get("content"), where)})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the calls of that assistant turn
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                output = _text(output, f"{where}.output") if isinstance(output, list) else json.dumps(output)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        else:
            raise _fail(f"{where}: input items of type {kind!r} are not supported", where)
    return messages


def _message_item(text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{uuid.uuid4().hex}",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]
        if status == "completed"
        else [],
    }


def _call_item(call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{uuid.uuid4().hex}",
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"] if status == "completed" else "",
        "status": status,
    }


def _usage(usage: dict[str, int]) -> dict[str, Any]:
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }


def response_object(
    body: dict[str, Any],
    model: str,
    output: list,
    usage: dict | None,
    finish: str | None,
    rid: str | None = None,
) -> dict[str, Any]:
    """A ``response`` object (``status`` from the chat finish reason; None: in progress)."""
    status = "in_progress" if finish is None else ("incomplete" if finish == "length" else "completed")
    return {
        "id": rid or f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "usage": _usage(usage) if usage else None,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "previous_response_id": None,
        "reasoning": None,
    }


def response_from_chat(body: dict[str, Any], chat: dict[str, Any]) -> dict[str, Any]:
    """The ``/v1/responses`` body for a finished chat completion."""
    choice = chat["choices"][0]
    message = choice["message"]
    output = []
    if message.get("content"):
        output.append(_message_item(message["content"]))
    output += [_call_item(c) for c in message.get("tool_calls") or ()]
    return response_object(body, chat["model"], output, chat["usage"], choice["finish_reason"])


async def response_events(
    body: dict[str, Any], model: str, chunks: AsyncIterator[dict]
) -> AsyncIterator[dict]:
    """The Responses stream events for a chat stream's ``chunks`` (with usage), sent as the chunks arrive: a
    call's item once its name is written, then its arguments a piece at a time (tool_stream.py)."""
    stream = _ResponseStream(body, model)
    yield stream.event("response.created", response=stream.snapshot(None))
    yield stream.event("response.in_progress", response=stream.snapshot(None))
    async for chunk in chunks:
        if chunk.get("usage"):
            stream.usage = chunk["usage"]
        for choice in chunk.get("choices", ()):
            delta = choice.get("delta") or {}
            if delta.get("content"):
                for e in stream.text(delta["content"]):
                    yield e
            for piece in delta.get("tool_calls") or ():
                for e in stream.call_piece(piece):
                    yield e
            stream.finish = choice.get("finish_reason") or stream.finish
    for e in stream.close_text():
        yield e
    for e in stream.close_calls():
        yield e
    final = stream.snapshot(stream.finish or "stop")
    # OpenAI ends the stream of a response cut at max_output_tokens with response.incomplete
    yield stream.event(f"response.{final['status']}", response=final)


class _ResponseStream:
    """The state of one Responses stream: its output items in the order they were added, each sent as soon
    as it starts (``output_index`` is its place in ``output``)."""

    def __init__(self, body: dict[str, Any], model: str) -> None:
        self.body, self.model = body, model
        self.rid = f"resp_{uuid.uuid4().hex}"
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # finished items and, in place, the open ones
        self.text_index: int | None = None  # the open message item
        self.calls: dict[int, int] = {}  # a chat tool-call index -> its item's output index
        self.finish: str | None = None
        self.usage: dict | None = None

    def event(self, kind: str, **fields) -> dict[str, Any]:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def snapshot(self, finish: str | None) -> dict[str, Any]:
        output = [item for item in self.output if item["status"] == "completed"] if finish else []
        return response_object(self.body, self.model, output, self.usage, finish, self.rid)

    def text(self, piece: str) -> list[dict[str, Any]]:
        out = []
        if self.text_index is None:
            item = _message_item("", status="in_progress")
            item["text"] = ""  # the text so far (dropped when the item is done)
            self.text_index = len(self.output)
            self.output.append(item)
            out.append(self.event("response.output_item.added", output_index=self.text_index,
                                  item=_public(item)))  # fmt: skip
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(self._text_event("response.content_part.added", part=part))
        self.output[self.text_index]["text"] += piece
        out.append(self._text_event("response.output_text.delta", delta=piece))
        return out

    def _text_event(self, kind: str, **fields) -> dict[str, Any]:
        item = self.output[self.text_index]
        return self.event(kind, item_id=item["id"], output_index=self.text_index, content_index=0, **fields)

    def close_text(self) -> list[dict[str, Any]]:
        if self.text_index is None:
            return []
        item = self.output[self.text_index]
        text = item.pop("text")
        part = {"type": "output_text", "text": text, "annotations": []}
        out = [
            self._text_event("response.output_text.done", text=text),
            self._text_event("response.content_part.done", part=part),
        ]
        item.update(status="completed", content=[part])
        out.append(self.event("response.output_item.done", output_index=self.text_index, item=item))
        self.text_index = None
        return out

    def call_piece(self, piece: dict[str, Any]) -> list[dict[str, Any]]:
        """Events for a chat ``tool_calls`` delta: a new call's item, then its arguments piece."""
        out = []
        index = self.calls.get(piece["index"])
        fn = piece.get("function") or {}
        if index is None:
            out += self.close_text()  # a message's text comes before the calls that follow it
            call = {"id": piece.get("id"), "function": {"name": fn.get("name"), "arguments": ""}}
            index = self.calls[piece["index"]] = len(self.output)
            self.output.append(_call_item(call, status="in_progress"))
            item = dict(self.output[index])  # as it is now: the arguments follow in their own events
            out.append(self.event("response.output_item.added", output_index=index, item=item))
        item = self.output[index]
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            out.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                  output_index=index, delta=fn["arguments"]))  # fmt: skip
        return out

    def close_calls(self) -> list[dict[str, Any]]:
        out = []
        for index in self.calls.values():
            item = self.output[index]
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                  output_index=index, arguments=item["arguments"]))  # fmt: skip
            item["status"] = "completed"
            out.append(self.event("response.output_item.done", output_index=index, item=item))
        self.calls = {}
        return out


def _public(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k != "text"}
