"""Model policies on OSWorld: an OpenAI-compatible endpoint (a local test server speaking the protocol)
and our engine over a tiny checkpoint, run end to end on the local desktop with token counts."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rz_agents.cli import main
from rz_agents.envs.osworld import LOCAL_TASKS
from rz_agents.envs.osworld.a11y import TRUNCATED
from rz_agents.eval.checkpoint_policy import load_checkpoint_policy
from rz_agents.eval.osworld_policies import (
    EnginePolicy,
    OpenAIPolicy,
    PolicyError,
    Sampling,
    parse_openai_spec,
)
from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.checkpoint import save_hf_checkpoint

RENAME = str(Path(LOCAL_TASKS) / "os" / "rz-os-rename-file.json")
needs_desktop = pytest.mark.skipif(
    not (shutil.which("Xvfb") and shutil.which("openbox")), reason="needs xvfb and openbox"
)
SOLVE = (
    "I will rename it.\n```python\nimport os\nos.rename('/home/user/Desktop/draft.txt', "
    "'/home/user/Desktop/final.txt')\n```"
)


class ChatServer:
    """A chat-completions server answering from a script (status codes and replies), recording requests."""

    def __init__(self, script: list[tuple[int, str]]) -> None:
        self.script, self.requests = list(script), []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(
                    {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
                )
                status, text = owner.script.pop(0) if owner.script else (200, "DONE")
                if status == 200:
                    prompt = sum(len(m["content"].split()) for m in body["messages"])
                    answer = {"choices": [{"message": {"role": "assistant", "content": text}}],
                              "usage": {"prompt_tokens": prompt,
                                        "completion_tokens": len(text.split())}}  # fmt: skip
                else:
                    answer = {"error": {"message": text}}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()


def test_openai_spec_splits_base_and_model():
    assert parse_openai_spec("openai:http://gpu:8000/v1/Qwen/Qwen3-4B") == (
        "http://gpu:8000/v1",
        "Qwen/Qwen3-4B",
    )
    assert parse_openai_spec("openai:https://api.example.com/llm/my-model") == (
        "https://api.example.com/llm",
        "my-model",
    )
    with pytest.raises(ValueError, match="openai:URL/MODEL"):
        parse_openai_spec("openai:gpu:8000")


def test_openai_client_sends_the_windowed_chat_and_reads_usage(monkeypatch):
    server = ChatServer([(503, "busy"), (200, "```WAIT```")])
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    try:
        policy = OpenAIPolicy(server.url, "tiny/model", Sampling(max_tokens=64, history_turns=1))
        chat = [{"role": "system", "content": "S"}] + [
            {"role": r, "content": f"{r} {i}"} for i in range(3) for r in ("user", "assistant")
        ] + [{"role": "user", "content": "now what"}]  # fmt: skip
        reply = policy(chat, {"id": "t"})
        assert reply.text == "```WAIT```" and reply.completion_tokens == 1 and reply.prompt_tokens == 7
        assert len(server.requests) == 2  # the 503 was retried
        request = server.requests[-1]
        assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer sk-test"
        body = request["body"]
        assert body["model"] == "tiny/model" and body["max_tokens"] == 64 and body["temperature"] == 0.0
        assert [m["content"] for m in body["messages"]] == ["S", "user 2", "assistant 2", "now what"]
        server.script = [(401, "bad key")]
        with pytest.raises(PolicyError, match="HTTP 401: .*bad key"):
            policy(chat, {"id": "t"})
    finally:
        server.close()


@needs_desktop
def test_rz_osworld_eval_with_an_openai_endpoint_solves_the_task(capsys):
    server = ChatServer([(200, SOLVE), (200, "DONE")])
    try:
        assert (
            main(
                ["osworld", "eval", "--tasks", RENAME, "--policy", f"openai:{server.url}/scripted", "--json"]
            )
            == 0
        )
    finally:
        server.close()
    row = json.loads(capsys.readouterr().out)["tasks"][0]
    assert (row["status"], row["score"], row["turns"]) == ("ok", 1.0, 2)
    assert row["prompt_tokens"] > 100 and row["completion_tokens"] == len(SOLVE.split()) + 1
    first = server.requests[0]["body"]["messages"]
    assert first[0]["role"] == "system" and "Rename the file draft.txt" in first[0]["content"]
    assert first[1]["content"].startswith("Given the info from accessibility tree as below:")


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> str:
    """A random tiny Qwen3 with the real vocabulary (Qwen3's tokenizer is used: no tokenizer.json)."""
    cfg = ModelConfig.tiny("qwen3", vocab_size=151936, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                           max_position_embeddings=4096)  # fmt: skip
    model = Transformer(cfg)
    model.reset_parameters(std=0.05, seed=0)
    return str(save_hf_checkpoint(model, tmp_path_factory.mktemp("ckpt") / "tiny-qwen3"))


def test_engine_policy_fits_long_chats_into_its_context(tiny_checkpoint):
    policy = EnginePolicy(
        load_checkpoint_policy(tiny_checkpoint),
        Sampling(max_tokens=8, history_turns=3),
        max_len=700,
        num_threads=1,
    )
    tree = "\n".join(f'push-button\tButton {i}\t""\t\t\t({i}, 5)\t(10, 10)' for i in range(400))
    chat = [{"role": "system", "content": "You act on a desktop."}]
    for i in range(4):
        chat += [
            {"role": "user", "content": f"obs {i}: {tree}"},
            {"role": "assistant", "content": "```WAIT```"},
        ]
    chat.append({"role": "user", "content": "current: " + tree})
    tokens = policy.fit(chat)
    assert len(tokens) <= 700 - 8
    text = policy.policy.tokenizer.decode(tokens)
    assert "You act on a desktop." in text and "current: push-button" in text and TRUNCATED in text
    assert "obs 3" not in text  # older turns went first
    reply = policy(chat, {"id": "t"})
    assert reply.prompt_tokens == len(tokens) and 1 <= reply.completion_tokens <= 8


@needs_desktop
def test_rz_eval_osworld_with_a_checkpoint_runs_the_loop_and_counts_tokens(tiny_checkpoint, capsys):
    argv = ["eval", "osworld", "--tasks", RENAME, "--checkpoint", tiny_checkpoint, "--max-steps", "2",
            "--max-tokens", "8", "--num-threads", "1"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("rz-os-rename-file"))
    cells = row.split()
    assert cells[2] == "ok" and cells[4] == "2"  # the random model never solves it; both turns ran
    prompt_tok, reply_tok = int(cells[-2]), int(cells[-1])
    assert prompt_tok > 500 and 2 <= reply_tok <= 16
    assert (
        main(["eval", "osworld", "--tasks", RENAME, "--checkpoint", tiny_checkpoint, "--policy", "noop"]) == 2
    )
    assert "either --checkpoint or --policy" in capsys.readouterr().err
