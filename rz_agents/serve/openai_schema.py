"""OpenAI request bodies -> checked plain data; anything malformed -> an OpenAI-style error naming the field.

The server accepts what it can serve exactly and refuses the rest with a 400 that says why: a parameter it
would otherwise ignore silently (penalties, logit_bias) changes what the client believes was sampled, which
an RL trainer must never be wrong about. ``tool_choice: "required"`` or a named function is served by
starting the reply with the tool call's opening (and the name) as context tokens the model did not sample:
the tokens it does sample are drawn from, and scored under, its own unconstrained distribution. The opening
is the policy's tool-call format's (serve/tool_formats.py): the server writes it (``ChatRequest.forced``).
A field the server does not know at all is ignored with a logged warning, as vLLM does (frameworks send
their own extras), or refused with ``strict=True`` (``rz serve --strict-fields``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from rz_agents.serve.image_parts import image_part, image_url_of

log = logging.getLogger(__name__)

MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_STOP = 4
SESSION_HEADER = "x-rz-session"
SESSION_METADATA_KEY = "rz_session"
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


class OpenAIError(Exception):
    """An error the client gets as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI's API returns for an error."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class Sampling:
    """The sampling fields shared by chat and text completions."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False


@dataclass
class ChatRequest:
    """A checked ``/v1/chat/completions`` body."""

    model: str
    messages: list[dict[str, Any]]
    sampling: Sampling
    tools: list[dict[str, Any]] | None = None
    parse_tools: bool = True  # tool_choice "auto" (False for "none")
    # tool_choice "required" (True) or a named function (its name): a call is forced
    forced_tool: str | bool = False
    # the forced call's opening in the policy's format (set by the server): the reply's start, given to the
    # model as context (not sampled), so every sampled token and its log-prob is the model's own distribution
    forced: str = ""
    session: str | None = None
    enable_thinking: bool = True


@dataclass
class CompletionRequest:
    """A checked ``/v1/completions`` body: one prompt (text or token ids) or a list of them."""

    model: str
    prompts: list[str | list[int]]
    sampling: Sampling = field(default_factory=Sampling)


_COMMON = {
    "model", "n", "temperature", "top_p", "top_k", "max_tokens", "seed", "stop", "logprobs", "stream",
    "stream_options", "user", "presence_penalty", "frequency_penalty", "logit_bias", "return_token_ids",
    "metadata",
}  # fmt: skip
_CHAT = _COMMON | {
    "messages", "tools", "tool_choice", "parallel_tool_calls", "top_logprobs", "max_completion_tokens",
    "response_format", "chat_template_kwargs", "store",
}  # fmt: skip
_COMPLETION = _COMMON | {"prompt", "echo", "suffix", "best_of"}


def _fail(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(message, param)


def _number(body: dict, name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(f"'{name}' must be a number, got {value!r}", name)
    if value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise _fail(f"'{name}' must be in {bracket}{low}, {high}], got {value}", name)
    return float(value)


def _integer(body: dict, name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(f"'{name}' must be an integer, got {value!r}", name)
    if value < low or (high is not None and value > high):
        limit = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise _fail(f"'{name}' must be {limit}, got {value}", name)
    return value


def _boolean(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _fail(f"'{name}' must be true or false, got {value!r}", name)
    return value


def _check_object(body: Any, allowed: set[str], strict: bool) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _fail(f"the request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - allowed)
    if unknown and strict:
        raise _fail(f"Unrecognized request argument supplied: {', '.join(unknown)}", unknown[0])
    if unknown:
        log.warning("ignoring unrecognized request fields: %s", ", ".join(unknown))
        body = {k: v for k, v in body.items() if k in allowed}
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _fail("'model' is required and must be a string", "model")
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, 0.0, -2.0, 2.0) != 0.0:
            raise _fail(f"'{name}' is not supported (it would change the sampled distribution)", name)
    if body.get("logit_bias"):
        raise _fail("'logit_bias' is not supported (it would change the sampled distribution)", "logit_bias")
    return body


def _sampling(body: dict[str, Any], max_tokens_names: tuple[str, ...]) -> Sampling:
    s = Sampling()
    s.n = _integer(body, "n", 1, 1, MAX_N)
    s.temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    s.top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    s.top_k = _integer(body, "top_k", 0, 0)
    for name in max_tokens_names:
        value = _integer(body, name, None, 1)
        if value is not None:
            s.max_tokens = value
    s.seed = _integer(body, "seed", None, -(2**63), 2**63 - 1)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(x, str) and x for x in stop):
            raise _fail("'stop' must be a non-empty string or a list of non-empty strings", "stop")
        if len(stop) > MAX_STOP:
            raise _fail(f"'stop' takes at most {MAX_STOP} sequences, got {len(stop)}", "stop")
        s.stop = tuple(stop)
    s.stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
            raise _fail("'stream_options' must be an object with 'include_usage'", "stream_options")
        if not s.stream:
            raise _fail("'stream_options' is only allowed when 'stream' is true", "stream_options")
        s.include_usage = _boolean(options, "include_usage")
    s.return_token_ids = _boolean(body, "return_token_ids")
    return s


def _text_content(content: Any, i: int) -> str | list[dict[str, Any]] | None:
    """A message's content: a string, None, or a list of parts: text parts only are joined into a string;
    with images (``image_url`` data URIs) it stays a list of text and image parts (image_parts.py)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[dict[str, Any]] = []
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            where = f"messages[{i}].content[{k}]"
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": part["text"]})
            elif kind == "image_url":
                try:
                    parts.append(image_part(image_url_of(part)))
                except ValueError as e:
                    raise _fail(f"{where}: {e}", where) from None
            else:
                raise _fail(
                    f"{where}: only text and image_url parts are supported, got a {kind!r} part", where
                )
        if all(p["type"] == "text" for p in parts):
            return "".join(p["text"] for p in parts)
        return parts
    where = f"messages[{i}].content"
    raise _fail(f"{where} must be a string or a list of content parts", where)


def _tool_calls(calls: Any, i: int) -> list[dict[str, Any]]:
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise _fail(f"{where} must be a list", where)
    out = []
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _fail(
                f"{where}[{k}] must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}", where
            )
        arguments = fn.get("arguments", "{}")
        if not isinstance(arguments, (str, dict)):
            raise _fail(f"{where}[{k}].function.arguments must be a JSON string", where)
        out.append(
            {
                "id": call.get("id"),
                "type": "function",
                "function": {"name": fn["name"], "arguments": arguments},
            }
        )
    return out


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages in the shape the chat template renders (role, content, tool_calls, reasoning)."""
    if not isinstance(messages, list) or not messages:
        raise _fail("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _fail(f"messages[{i}] must be an object, got {type(m).__name__}", f"messages[{i}]")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise _fail(
                f"messages[{i}].role must be one of {CHAT_ROLES}, got {role!r}", f"messages[{i}].role"
            )
        message: dict[str, Any] = {"role": "system" if role == "developer" else role}
        message["content"] = _text_content(m.get("content"), i)
        if role == "assistant":
            if m.get("tool_calls"):
                message["tool_calls"] = _tool_calls(m["tool_calls"], i)
            reasoning = m.get("reasoning_content")
            if reasoning is not None:
                if not isinstance(reasoning, str):
                    raise _fail(f"messages[{i}].reasoning_content must be a string", f"messages[{i}]")
                message["reasoning_content"] = reasoning
        elif message["content"] is None:
            raise _fail(f"messages[{i}] ({role}) needs a 'content'", f"messages[{i}].content")
        if role == "tool" and isinstance(m.get("tool_call_id"), str):
            message["tool_call_id"] = m["tool_call_id"]  # Kimi's template writes it ("## Return of ID")
        out.append(message)
    return out


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, bool, str | bool]:
    """(tools, parse the reply for calls, the forced call: True for any, a tool's name, False for none)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise _fail("'tool_choice' needs 'tools'", "tool_choice")
        return None, False, False
    if not isinstance(tools, list):
        raise _fail("'tools' must be a list", "tools")
    for k, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(fn, dict)
        ):
            raise _fail(f"tools[{k}] must be {{'type': 'function', 'function': {{...}}}}", f"tools[{k}]")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _fail(f"tools[{k}].function.name must be a non-empty string", f"tools[{k}].function.name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise _fail(f"tools[{k}].function.parameters must be a JSON schema object", f"tools[{k}]")
    if choice in (None, "auto"):
        return tools or None, True, False
    if choice == "none":
        return tools or None, False, False
    if not tools:
        raise _fail("'tool_choice' needs a non-empty 'tools'", "tool_choice")
    if choice == "required":
        return tools, True, True
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise _fail(
            "'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name'}}",
            "tool_choice",
        )
    if name not in {t["function"]["name"] for t in tools}:
        raise _fail(f"tool_choice names {name!r}, which is not in 'tools'", "tool_choice")
    return tools, True, name


def parse_chat(body: Any, header_session: str | None = None, strict: bool = False) -> ChatRequest:
    """A checked chat request; raises OpenAIError naming the bad field (an unknown one too if ``strict``)."""
    body = _check_object(body, _CHAT, strict)
    sampling = _sampling(body, ("max_tokens", "max_completion_tokens"))
    sampling.logprobs = _boolean(body, "logprobs")
    sampling.top_logprobs = _integer(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if sampling.top_logprobs and not sampling.logprobs:
        raise _fail("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise _fail("'response_format' other than {'type': 'text'} is not supported", "response_format")
    tools, parse_tools, forced_tool = _tools(body)
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict) or set(kwargs) - {"enable_thinking"}:
        raise _fail("'chat_template_kwargs' takes only 'enable_thinking'", "chat_template_kwargs")
    session = header_session
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise _fail("'metadata' must be an object of string values", "metadata")
        session = metadata.get(SESSION_METADATA_KEY, session)
    if session is not None and (not session or len(session) > 256):
        raise _fail("a session id must be 1 to 256 characters", "metadata")
    if session is not None and sampling.n != 1:
        raise _fail("a session records one conversation: 'n' must be 1 in a session", "n")
    return ChatRequest(
        model=body["model"],
        messages=chat_messages(body.get("messages")),
        sampling=sampling,
        tools=tools,
        parse_tools=parse_tools,
        forced_tool=forced_tool,
        session=session,
        enable_thinking=_boolean(kwargs, "enable_thinking", True),
    )


def parse_completion(body: Any, strict: bool = False) -> CompletionRequest:
    """A checked text-completion request; raises OpenAIError naming the bad field (an unknown one too if
    ``strict``)."""
    body = _check_object(body, _COMPLETION, strict)
    sampling = _sampling(body, ("max_tokens",))
    if sampling.max_tokens is None:
        sampling.max_tokens = 16  # the OpenAI default for /v1/completions
    logprobs = _integer(body, "logprobs", None, 0, 5)
    sampling.logprobs = logprobs is not None
    sampling.top_logprobs = logprobs or 0
    if _boolean(body, "echo"):
        raise _fail("'echo' is not supported", "echo")
    if body.get("suffix"):
        raise _fail("'suffix' is not supported", "suffix")
    if body.get("best_of") not in (None, 1):
        raise _fail("'best_of' is not supported", "best_of")
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_id(t) for t in prompt)):
        prompts = [prompt]
    elif (
        isinstance(prompt, list)
        and prompt
        and all(
            isinstance(p, str) or (isinstance(p, list) and p and all(_is_id(t) for t in p)) for p in prompt
        )
    ):
        prompts = list(prompt)
    else:
        raise _fail("'prompt' must be a string, a list of token ids, or a list of those", "prompt")
    if any(p == "" for p in prompts):
        raise _fail("'prompt' must not be empty", "prompt")
    return CompletionRequest(model=body["model"], prompts=prompts, sampling=sampling)


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)
