"""One client's bad request harms nobody else: every malformed body is an OpenAI-style 4xx JSON error (deep
nesting, integers too long to convert, lone surrogates in the model, a field name, a prompt or a message),
a request whose forward fails fails alone while concurrent requests finish exactly as they would have, and
`rz serve` refuses at start a max_len the model has no positions for."""

from __future__ import annotations

import concurrent.futures
import copy

import httpx
import pytest
from serve_fixtures import MODEL, Served

from rz_agents.cli.serve import build_server
from rz_agents.engine import EngineConfig, RZEngine
from rz_agents.model import ModelConfig, Transformer
from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer
from rz_agents.serve import OpenAIServer, ServerThread

JSON = {"Content-Type": "application/json"}
MSG = b'[{"role": "user", "content": "hi"}]'
MALFORMED = {
    "deep nesting": b'{"model": "tiny-rz", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "deep nesting in a string-free object": b'{"a":' * 3000 + b"1" + b"}" * 3000,
    "5,000-digit integer": b'{"model": "tiny-rz", "max_tokens": '
    + b"9" * 5000
    + b', "messages": '
    + MSG
    + b"}",
    "5,000-digit prompt id": b'{"model": "tiny-rz", "prompt": [' + b"7" * 5000 + b"]}",
    "lone surrogate in model": b'{"model": "\\ud800", "messages": ' + MSG + b"}",
    "lone surrogate in a field name": b'{"model": "tiny-rz", "\\udfff": 1, "messages": ' + MSG + b"}",
    "lone surrogate in a prompt": b'{"model": "tiny-rz", "prompt": "a\\ud800b"}',
    "lone surrogate in a message": b'{"model": "tiny-rz", "messages": [{"role": "user", "content": '
    + b'"\\udc00"}]}',
    "not an object": b"[1, 2, 3]",
    "invalid UTF-8": b'{"model": "\xff\xfe"}',
    "a huge float": b'{"model": "tiny-rz", "temperature": 1e999, "messages": ' + MSG + b"}",
    "NaN": b'{"model": "tiny-rz", "temperature": NaN, "messages": ' + MSG + b"}",
}


@pytest.fixture(scope="module")
def served():
    s = Served(taught=False)
    yield s
    s.stop()


@pytest.mark.parametrize("name", list(MALFORMED))
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_a_malformed_body_is_an_openai_style_4xx(served, name, route):
    r = httpx.post(f"{served.http.root}{route}", content=MALFORMED[name], headers=JSON, timeout=30)
    assert 400 <= r.status_code < 500, (name, r.status_code, r.text[:200])
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and isinstance(error["message"], str)
    assert httpx.get(f"{served.http.root}/health").status_code == 200  # and the server is fine


def test_an_unknown_field_is_ignored_with_a_warning_or_refused_when_strict(served, caplog):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "frobnicate": 1}
    with caplog.at_level("WARNING", logger="rz_agents.serve.openai_schema"):
        r = httpx.post(f"{served.http.root}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200 and any("frobnicate" in x.getMessage() for x in caplog.records)
    strict = Served(taught=False, strict_fields=True)
    try:
        r = httpx.post(f"{strict.http.root}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "frobnicate"
    finally:
        strict.stop()


def test_a_request_whose_forward_fails_leaves_concurrent_requests_unharmed():
    """An engine whose max_len is beyond the model's positions (rz serve refuses that at start; an embedder
    could still build one): a long prompt fails in the forward, in the same steps as six other clients."""
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    model = Transformer(ModelConfig.tiny("qwen3", max_position_embeddings=64), kernels="aligned")
    model.reset_parameters(std=0.05, seed=0)  # rope.check_top refuses positions past 64
    config = EngineConfig(max_running=16, max_len=256, max_batch_tokens=512, num_threads=1)
    reference = RZEngine(copy.deepcopy(model).requires_grad_(False), config, decode=tok.decode)
    engine = RZEngine(model.requires_grad_(False), config, decode=tok.decode)
    server = OpenAIServer(engine, tok, tpl, model_name=MODEL)
    others = [{"model": MODEL, "prompt": [i + 1, i + 2, i + 3], "max_tokens": 12, "seed": i,
               "return_token_ids": True} for i in range(6)]  # fmt: skip
    bad = {"model": MODEL, "prompt": list(range(1, 120)), "max_tokens": 4}
    with ServerThread(server) as http, concurrent.futures.ThreadPoolExecutor(7) as pool:
        post = lambda body: httpx.post(f"{http.root}/v1/completions", json=body, timeout=60)  # noqa: E731
        futures = [pool.submit(post, b) for b in [*others[:3], bad, *others[3:]]]
        answers = [f.result() for f in futures]
    failed = answers.pop(3)
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "server_error"
    assert "max_position_embeddings" in failed.json()["error"]["message"]
    ref_server = OpenAIServer(reference, tok, tpl, model_name=MODEL)
    with ServerThread(ref_server) as http:
        alone = [httpx.post(f"{http.root}/v1/completions", json=b, timeout=60).json() for b in others]
    for got, want in zip(answers, alone, strict=True):
        assert got.status_code == 200
        assert got.json()["choices"][0]["token_ids"] == want["choices"][0]["token_ids"]


def test_rz_serve_refuses_a_max_len_beyond_the_models_positions():
    with pytest.raises(ValueError, match="beyond the model's 512 positions"):
        build_server("openai-agent", [], max_len=1024)
    _, engine = build_server("openai-agent", [], max_len=512)
    assert engine.config.max_len == 512
