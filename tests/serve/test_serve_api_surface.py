"""The API surface agent frameworks call beyond chat completions: ``GET /v1/models/{id}``, and a tool-call
history sent back without a session renders the tokens the model sampled (the byte template writes an
assistant's ``tool_calls``, not "None")."""

from __future__ import annotations

import httpx
import openai
import pytest
from serve_fixtures import ADD_TOOL, MODEL, QUESTION, Served


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
