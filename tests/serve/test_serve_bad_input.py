"""Bad input gets an OpenAI-style 4xx JSON error naming what is wrong; a client that disconnects cancels its
sequences and their pages are freed."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from serve_fixtures import MODEL, Served


@pytest.fixture(scope="module")
def served():
    s = Served(taught=False)
    yield s
    s.stop()


def _post(served, path, body, raw=False, headers=None):
    kw = {"content": body} if raw else {"json": body}
    headers = {"Content-Type": "application/json", **(headers or {})}
    return httpx.post(f"{served.http.root}{path}", headers=headers, timeout=30, **kw)


def _chat(**kw):
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **kw}


BAD_CHAT = [
    ({"messages": [{"role": "user", "content": "x"}]}, "model", "'model' is required"),
    (_chat(messages=[]), "messages", "non-empty list"),
    (_chat(messages=[{"role": "robot", "content": "x"}]), "messages[0].role", "role must be one of"),
    (_chat(messages=[{"role": "user"}]), "messages[0].content", "needs a 'content'"),
    (
        _chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        "messages[0].content[0]",
        "images must be data: URIs",
    ),
    (
        _chat(messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]),
        "messages[0].content[0]",
        "only text and image_url parts",
    ),
    (_chat(temperature=3), "temperature", "must be in [0.0, 2.0]"),
    (_chat(temperature="hot"), "temperature", "must be a number"),
    (_chat(top_p=0), "top_p", "must be in (0.0, 1.0]"),
    (_chat(n=0), "n", "must be in [1, 16]"),
    (_chat(max_tokens=0), "max_tokens", "must be >= 1"),
    (_chat(top_logprobs=2), "top_logprobs", "needs 'logprobs'"),
    (_chat(presence_penalty=0.5), "presence_penalty", "not supported"),
    (_chat(logit_bias={"5": 3}), "logit_bias", "not supported"),
    (_chat(stop=["a", "b", "c", "d", "e"]), "stop", "at most 4"),
    (_chat(tools={"name": "x"}), "tools", "must be a list"),
    (
        _chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="any"),
        "tool_choice",
        "must be 'auto', 'none', 'required'",
    ),
    (
        _chat(
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice={"type": "function", "function": {"name": "g"}},
        ),
        "tool_choice",
        "not in 'tools'",
    ),
    (_chat(tool_choice="auto"), "tool_choice", "needs 'tools'"),
    (_chat(n=2, metadata={"rz_session": "s"}), "n", "'n' must be 1 in a session"),
    (_chat(stream_options={"include_usage": True}), "stream_options", "only allowed when 'stream'"),
    (_chat(messages=[{"role": "user", "content": "x" * 600}]), "messages", "maximum context length"),
]


@pytest.mark.parametrize("body,param,message", BAD_CHAT, ids=[p for _, p, _ in BAD_CHAT])
def test_a_malformed_chat_request_gets_a_400_naming_the_field(served, body, param, message):
    r = _post(served, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (
        error["param"] == param and message in error["message"] and error["type"] == "invalid_request_error"
    )


def test_bad_json_unknown_model_unknown_route_and_bad_completion_prompts(served):
    r = _post(served, "/v1/chat/completions", b"{not json", raw=True)
    assert r.status_code == 400 and "could not parse the JSON body" in r.json()["error"]["message"]
    r = _post(served, "/v1/chat/completions", _chat(model="gpt-9"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.get(f"{served.http.root}/v2/nothing")
    assert r.status_code == 404 and "Not Found" in r.json()["error"]["message"]
    r = _post(served, "/v1/completions", {"model": MODEL, "prompt": [1, 99999]})
    assert r.status_code == 400 and "outside the vocabulary" in r.json()["error"]["message"]
    r = _post(served, "/v1/completions", {"model": MODEL, "prompt": {"a": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    too_long = _chat(messages=[{"role": "user", "content": "x" * 600}], stream=True)
    r = _post(served, "/v1/chat/completions", too_long)  # refused before the stream starts
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.get(f"{served.http.root}/v1/sessions/never-opened")
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"


def test_the_openai_client_raises_its_typed_errors_with_the_message(served):
    client = served.client()
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], temperature=-1
        )
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def _idle(engine, timeout_s=20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = engine.stats()
        if s["running"] == 0 and s["waiting"] == 0 and s["kv_bytes_held"] == 0:
            return True
        time.sleep(0.02)
    return False


def test_a_client_that_disconnects_cancels_its_sequence_and_frees_its_pages(served):
    engine, before = served.engine, dict(served.server.counters)
    generated = engine.counters["generated_tokens"]
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(
            f"{served.http.root}/v1/completions",
            json={"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 500},
            timeout=0.5,
        )
    assert _idle(engine)
    assert served.server.counters["disconnects"] == before["disconnects"] + 1
    assert engine.counters["generated_tokens"] - generated < 500  # stopped early, not run to the end


def test_a_streaming_client_that_disconnects_cancels_its_sequence_too(served):
    engine, before = served.engine, served.server.counters["disconnects"]
    generated = engine.counters["generated_tokens"]
    body = _chat(messages=[{"role": "user", "content": "tell"}], max_tokens=480, stream=True, stop=None)
    body["messages"] = [{"role": "user", "content": "t"}]
    with httpx.stream("POST", f"{served.http.root}/v1/chat/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")  # the role chunk: the request is running
    assert _idle(engine)
    assert served.server.counters["disconnects"] == before + 1
    assert engine.counters["generated_tokens"] - generated < 480
