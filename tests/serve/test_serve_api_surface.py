"""The API surface agent frameworks call beyond chat completions: ``GET /v1/models/{id}``; a tool-call
history sent back without a session renders the tokens the model sampled (the byte template writes an
assistant's ``tool_calls``, not "None"); ``tool_choice: "required"`` and a named function, served by giving
the model the call's opening as context, so the recorded log-probs are the distribution really sampled from
and the learner re-scores them bit for bit."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch
from serve_fixtures import ADD_TOOL, MODEL, QUESTION, Served, learner_logprobs


@pytest.fixture(scope="module")
def served():
    s = Served()
    yield s
    s.stop()


def test_a_model_card_by_id(served):
    client = served.client()
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.owned_by == "rz"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("gpt-9")
    assert httpx.get(f"{served.http.root}/sessions/s/v1/models/{MODEL}").json()["id"] == MODEL


def test_a_tool_call_history_sent_back_without_a_session_renders_the_sampled_tokens(served):
    client = served.client()
    messages = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[ADD_TOOL], max_tokens=80, temperature=0,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    message = first.choices[0].message
    assert message.tool_calls and message.tool_calls[0].function.name == "add"
    prompt, ids = first.model_extra["prompt_token_ids"], first.choices[0].model_extra["token_ids"]
    messages += [
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "5"},
    ]
    second = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[ADD_TOOL], max_tokens=20, temperature=0,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    history = second.model_extra["prompt_token_ids"]
    assert history[: len(prompt) + len(ids)] == prompt + ids  # what the model sampled, call and stop token
    assert "None" not in served.tokenizer.decode(history)


def _forced_turn(served, session, tool_choice, content=QUESTION):
    client = served.client(default_headers={"X-RZ-Session": session})
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], tools=[ADD_TOOL],
        tool_choice=tool_choice, max_tokens=60, temperature=1.0, seed=5, logprobs=True,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    return r, served.server.sessions.sessions[session]


@pytest.mark.parametrize(
    "tool_choice,opening",
    [
        ({"type": "function", "function": {"name": "add"}}, '<tool_call>\n{"name": "add", "arguments": '),
        ("required", '<tool_call>\n{"name": '),
    ],
    ids=["named", "required"],
)
def test_a_forced_tool_choice_is_context_and_the_sampled_tokens_are_the_models_own(
    served, tool_choice, opening
):
    r, session = _forced_turn(served, f"forced-{len(opening)}", tool_choice, content="hello")
    prompt, ids = r.model_extra["prompt_token_ids"], r.choices[0].model_extra["token_ids"]
    forced = served.tokenizer.encode(opening)
    assert prompt[-len(forced) :] == forced  # the opening is the prompt's end: given, not sampled
    traj = session.trajectory(reward=1.0, group_id=0)
    assert traj.tokens == prompt + ids and sum(traj.loss_mask) == len(ids)
    assert not any(traj.loss_mask[len(prompt) - len(forced) : len(prompt)])
    mask = torch.tensor(traj.loss_mask[1:])
    behavior = torch.tensor(traj.behavior_logprobs[1:], dtype=torch.float32)
    learner = learner_logprobs(served.learner_model, traj.tokens, temperature=1.0)
    assert torch.equal(learner[mask], behavior[mask])  # the distribution sampled from, bit for bit
    got = torch.tensor([e.logprob for e in r.choices[0].logprobs.content], dtype=torch.float32)
    assert torch.equal(got, behavior[mask])
    unforced = learner_logprobs(served.learner_model, prompt[: -len(forced)] + ids, temperature=1.0)
    assert not torch.equal(unforced[-len(ids) :], got)  # negative control: without the opening they differ


def test_a_named_tool_choice_gets_that_call(served):
    r, _ = _forced_turn(served, "named-add", {"type": "function", "function": {"name": "add"}})
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
