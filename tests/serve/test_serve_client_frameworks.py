"""Agent frameworks nobody on the project wrote, each against a real `rz serve` on 127.0.0.1 with an API key:
the openai SDK, LangChain (langchain-openai), litellm, the OpenAI Agents SDK (its default Responses model)
and smolagents (its ToolCallingAgent). Each client completes a chat call, a streamed call and a tool round
trip (the model writes the call, the framework runs the tool and sends its result back, the model answers).

The clients live in their own venv (scripts/install_clients.sh; no torch there) and each runs in a
subprocess of that venv's python (tests/serve/clients/*.py), talking HTTP to the server this module starts.
The policy is the tiny model taught the replies (client_policy.py); where a framework lets the caller name
the tool, the tests do (``tool_choice``), as a tiny model needs.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from client_policy import CHAT_REPLY, MAX_LEN, TOOL, client_policy
from serve_fixtures import ANSWER_TEXT, MODEL, QUESTION, Served

CLIENTS_VENV = Path(os.environ.get("RZ_CLIENTS_VENV", "/work/venvs/clients"))
PYTHON = CLIENTS_VENV / "bin" / "python"
CLIENTS = Path(__file__).parent / "clients"
KEY = "sk-client-frameworks"

pytestmark = pytest.mark.skipif(
    not PYTHON.exists(),
    reason=f"no client venv at {CLIENTS_VENV} (bash scripts/install_clients.sh; RZ_CLIENTS_VENV moves it)",
)


@pytest.fixture(scope="module")
def served():
    s = Served(max_len=MAX_LEN, model=client_policy(), api_keys=(KEY,))
    yield s
    s.stop()


def _run_client(served: Served, name: str, **extra) -> dict:
    spec = {
        "base_url": served.http.url, "api_key": KEY, "model": MODEL, "chat_prompt": "Say hi.",
        "question": QUESTION, "tool": TOOL, **extra,
    }  # fmt: skip
    env = {**os.environ, "PYTHONPATH": "", "OPENAI_AGENTS_DISABLE_TRACING": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [str(PYTHON), str(CLIENTS / f"{name}_client.py"), json.dumps(spec)],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert done.returncode == 0, f"{name} failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("client", ["openai_sdk", "langchain", "litellm", "openai_agents"])
def test_a_framework_chats_streams_and_completes_a_tool_round_trip(served, client):
    requests_before = served.server.counters["chat_requests"]
    got = _run_client(served, client)
    assert got["chat"] == CHAT_REPLY and got["streamed"] == CHAT_REPLY
    assert got["call"] == {"name": "add", "arguments": {"a": 2, "b": 3}}  # parsed by the framework
    assert got["final"] == ANSWER_TEXT  # the tool's result went back and the model answered
    assert served.server.counters["chat_requests"] - requests_before >= 4  # all of it through rz serve


def test_smolagents_tool_calling_agent_runs_the_tool_and_gives_its_final_answer(served):
    got = _run_client(served, "smolagents")
    assert got["chat"] == CHAT_REPLY and got["streamed"] == CHAT_REPLY
    assert got["call"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert got["final"] == ANSWER_TEXT  # through smolagents' own final_answer tool
