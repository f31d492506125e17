"""The policy the client-framework tests serve: the tiny model of serve_fixtures taught (a few hundred
supervised steps, seconds) the replies those tests ask of it, so the frameworks' tool round trips are
carried out by a model that really writes the calls, through the real engine and server.

Why teach rather than ship weights: the byte tokenizer's tiny model is made and taught in seconds, so no
binary lives in the repository and the replies stay readable here. Why forced tool_choice as well: a
taught tiny model learns its examples, not tool use, so the tests name the tool (``tool_choice``) where the
framework lets them; the reply's opening is then context, and the model writes the arguments itself.

Each example is (messages, tools, reply): the conversation a framework sends and the assistant text the
model learns to write after it (then the stop token).
"""

from __future__ import annotations

import copy
import json
import random

import torch
from serve_fixtures import ADD_TOOL, ANSWER_TEXT, CALL_TEXT, QUESTION

from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.logprobs import packed_token_logprobs
from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer

# The tool every client lists (the OpenAI Agents SDK always sends a description, so every client does)
TOOL = {"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                         "parameters": ADD_TOOL["function"]["parameters"]}}  # fmt: skip
# The tools smolagents' ToolCallingAgent lists for TOOL (its schema of an `add` tool taking a and b, and its
# final_answer tool): what the server renders for it
SMOLAGENTS_TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "description": "a"},
                                         "b": {"type": "integer", "description": "b"}},
        "required": ["a", "b"]}}},
    {"type": "function", "function": {
        "name": "final_answer", "description": "Provides a final answer to the given problem.",
        "parameters": {"type": "object", "properties": {
            "answer": {"type": "string", "description": "The final answer to the problem"}},
            "required": ["answer"]}}},
]  # fmt: skip
CHAT_PROMPT = "Say hi."
MAX_LEN = 2048
CHAT_REPLY = "Hi!"
FINAL_ANSWER_CALL = (
    '<tool_call>\n{"name": "final_answer", "arguments": {"answer": "' + ANSWER_TEXT + '"}}\n</tool_call>'
)
CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
]}  # fmt: skip


def examples() -> list[tuple[list[dict], list[dict] | None, str]]:
    """What the tests' clients send and what the policy answers."""
    asked = [{"role": "user", "content": QUESTION}]
    answered = [*asked, CALLED, {"role": "tool", "content": "5"}]
    smol = [{"role": "system", "content": ""}, {"role": "user", "content": f"New task:\n{QUESTION}"}]
    data = [
        ([{"role": "user", "content": CHAT_PROMPT}], None, CHAT_REPLY),
        (asked, [TOOL], CALL_TEXT),
        (answered, [TOOL], ANSWER_TEXT),
        (smol, SMOLAGENTS_TOOLS, CALL_TEXT),
    ]
    # smolagents sends the call back as text with the server's random call id, then the tool's output as a
    # user "Observation": taught with a few ids, so the model learns to look past them
    rng = random.Random(0)
    for _ in range(3):
        call_id = f"call_{rng.getrandbits(96):024x}"
        fn = {"name": "add", "arguments": {"a": 2, "b": 3}}
        called = {"id": call_id, "type": "function", "function": fn}
        observed = [
            *smol,
            {"role": "assistant", "content": f"Calling tools:\n[{called!r}]"},
            {"role": "user", "content": "Observation:\n5"},
        ]
        data.append((observed, SMOLAGENTS_TOOLS, FINAL_ANSWER_CALL))
    return data


def teach(model: Transformer, data, steps: int = 300) -> Transformer:
    """Supervised steps on each example's reply tokens (the byte chat format), all examples per step."""
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    stop = tpl.stop_token_ids(tok)[0]
    seqs, masks = [], []
    for messages, tools, reply in data:
        prompt = tpl.encode_prompt(tok, messages, tools=tools)
        seq = prompt + tok.encode(reply) + [stop]
        mask = torch.zeros(len(seq) - 1, dtype=torch.bool)  # row t predicts token t+1
        mask[len(prompt) - 1 :] = True
        seqs.append(seq)
        masks.append(mask)
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        lps = packed_token_logprobs(model, seqs)
        loss = -torch.cat([lp[m] for lp, m in zip(lps, masks, strict=True)]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 2e-3:
            break
    return model.eval().requires_grad_(False)


def tiny_model(seed: int = 0) -> Transformer:
    """serve_fixtures' tiny model with room for smolagents' tool list (MAX_LEN positions)."""
    model = Transformer(ModelConfig.tiny("qwen3", max_position_embeddings=MAX_LEN), kernels="aligned")
    model.reset_parameters(std=0.05, seed=seed)
    return model


_TAUGHT: dict[str, Transformer] = {}


def client_policy() -> Transformer:
    """The taught policy (taught once per test session; callers get a copy)."""
    if "m" not in _TAUGHT:
        before = torch.get_num_threads()
        torch.set_num_threads(1)  # module fixtures are set up before the one-thread fixture
        try:
            _TAUGHT["m"] = teach(tiny_model(), examples())
        finally:
            torch.set_num_threads(before)
    return copy.deepcopy(_TAUGHT["m"])


def dumps(x) -> str:
    return json.dumps(x)
