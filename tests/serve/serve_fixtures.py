"""Shared by the rz serve tests: a tiny aligned model behind a real `rz serve` HTTP server on 127.0.0.1, for
the official openai client.

The model is taught (a few hundred supervised steps, a few seconds) one short tool-use conversation, so
greedy decoding really writes a ``<tool_call>`` and, after the tool's answer, a final reply: the tool path is
exercised by the model, not scripted.
"""

from __future__ import annotations

import copy
import json

import torch

from rz_agents.engine import EngineConfig, RZEngine
from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.logprobs import packed_token_logprobs
from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer
from rz_agents.serve import OpenAIServer, RLControl, ServeOptions, ServerThread

MODEL = "tiny-rz"
CONTROL_KEY = "control-key-for-tests"
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        },
    },
}
QUESTION = "2+3?"
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
ANSWER_TEXT = "It is 5."


def tiny_model(seed: int = 0) -> Transformer:
    cfg = ModelConfig.tiny("qwen3", max_position_embeddings=1024)
    model = Transformer(cfg, kernels="aligned")
    model.reset_parameters(std=0.05, seed=seed)
    return model.eval()


def _taught_tool_use(model: Transformer, steps: int = 120) -> Transformer:
    """Supervised steps on the two assistant turns of one conversation (the byte chat format)."""
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    first = tpl.encode_prompt(tok, [{"role": "user", "content": QUESTION}], tools=[ADD_TOOL])
    call = tok.encode(CALL_TEXT) + [tpl.stop_token_ids(tok)[0]]
    obs = tpl.encode_continuation(tok, [{"role": "tool", "content": "5"}])
    answer = tok.encode(ANSWER_TEXT) + [tpl.stop_token_ids(tok)[0]]
    seq = first + call + obs + answer
    mask = torch.zeros(len(seq) - 1, dtype=torch.bool)  # row t predicts token t+1
    mask[len(first) - 1 : len(first) + len(call) - 1] = True
    start = len(first) + len(call) + len(obs) - 1
    mask[start : start + len(answer)] = True
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        (lp,) = packed_token_logprobs(model, [seq])
        loss = -lp[mask].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 2e-3:
            break
    return model.eval().requires_grad_(False)


_TAUGHT: dict[str, Transformer] = {}


def taught_model() -> Transformer:
    """The tool-use-taught tiny model (taught once per test session; callers get a copy)."""
    if "m" not in _TAUGHT:
        # module fixtures are set up before the function-scoped one-thread fixture: pin here too
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            _TAUGHT["m"] = _taught_tool_use(tiny_model())
        finally:
            torch.set_num_threads(before)
    return copy.deepcopy(_TAUGHT["m"])


class Served:
    """A running server, the learner's copy of its weights and what built it."""

    def __init__(
        self,
        max_running: int = 16,
        taught: bool = True,
        control: bool = False,
        max_len: int = 512,
        model: Transformer | None = None,
        **options,
    ) -> None:
        self.tokenizer, self.template = ByteTokenizer(), ByteChatTemplate()
        if model is not None:  # a policy the caller taught (client_policy.py)
            self.learner_model = model
        else:
            self.learner_model = taught_model() if taught else tiny_model().requires_grad_(False)
        engine_model = copy.deepcopy(self.learner_model)
        self.engine_config = EngineConfig(
            max_running=max_running, max_len=max_len, max_batch_tokens=512, num_threads=1
        )
        self.engine = RZEngine(engine_model, self.engine_config, decode=self.tokenizer.decode)
        self.server = OpenAIServer(self.engine, self.tokenizer, self.template, model_name=MODEL)
        if control:
            options.setdefault("control_key", CONTROL_KEY)
        options.setdefault("session_records", True)
        self.options = ServeOptions(**options)
        self.control = RLControl(self.engine) if control else None
        self.http = ServerThread(self.server, options=self.options, control=self.control).start()

    def fresh_engine(self) -> RZEngine:
        """An in-process engine on the same weights (the reference the server's answers must equal)."""
        return RZEngine(copy.deepcopy(self.learner_model), self.engine_config, decode=self.tokenizer.decode)

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.http.url, api_key="unused", max_retries=0, **kw)

    def stop(self) -> None:
        self.http.stop()


def learner_logprobs(model, tokens, temperature=1.0, top_k=0, top_p=1.0) -> torch.Tensor:
    """The learner's packed-forward log-probs of tokens[1:]."""
    with torch.no_grad():
        (lp,) = packed_token_logprobs(model, [tokens], temperature=temperature, top_k=top_k, top_p=top_p)
    return lp


def dumps(x) -> str:
    return json.dumps(x)
