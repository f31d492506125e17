"""``POST /v1/responses`` (what the OpenAI Agents SDK calls by default) with the official openai client: text,
a real tool round trip by the taught model (function_call out, function_call_output back), streaming events,
and sessions: a conversation has the same tokens through the Responses API as through chat completions."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from serve_fixtures import ADD_TOOL, ANSWER_TEXT, MODEL, QUESTION, Served

FLAT_ADD = {"type": "function", "name": "add", "parameters": ADD_TOOL["function"]["parameters"]}


@pytest.fixture(scope="module")
def served():
    s = Served()
    yield s
    s.stop()


def _tool_round_trip(client, **kw):
    first = client.responses.create(model=MODEL, input=QUESTION, tools=[FLAT_ADD], temperature=0, **kw)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "add" and json.loads(call.arguments) == {"a": 2, "b": 3}
    items = [{"role": "user", "content": QUESTION}, *(i.model_dump(exclude_none=True) for i in first.output)]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "5"})
    second = client.responses.create(model=MODEL, input=items, tools=[FLAT_ADD], temperature=0, **kw)
    return first, second


def test_a_tool_round_trip_through_the_responses_api(served):
    first, second = _tool_round_trip(served.client())
    assert first.status == "completed" and first.usage.output_tokens > 0
    assert second.output_text == ANSWER_TEXT and second.status == "completed"


def test_text_equals_the_chat_completion_of_the_same_messages(served):
    client = served.client()
    r = client.responses.create(model=MODEL, input="hello", instructions="be brief", max_output_tokens=8,
                                temperature=0)  # fmt: skip
    chat = client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
    )  # fmt: skip
    assert r.output_text == chat.choices[0].message.content
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.input_tokens == chat.usage.prompt_tokens


def test_a_session_through_responses_has_the_tokens_of_the_same_session_through_chat(served):
    via_responses = served.client(default_headers={"X-RZ-Session": "via-responses"})
    _tool_round_trip(via_responses)
    via_chat = served.client(default_headers={"X-RZ-Session": "via-chat"})
    messages = [{"role": "user", "content": QUESTION}]
    first = via_chat.chat.completions.create(model=MODEL, messages=messages, tools=[ADD_TOOL], temperature=0)
    message = first.choices[0].message
    messages += [
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "5"},
    ]
    via_chat.chat.completions.create(model=MODEL, messages=messages, tools=[ADD_TOOL], temperature=0)
    records = [httpx.get(f"{served.http.root}/v1/sessions/{s}").json() for s in ("via-responses", "via-chat")]
    assert records[0]["tokens"] == records[1]["tokens"] and records[0]["turns"] == 2
    assert records[0]["prefix_mismatches"] == 0 and records[0]["loss_mask"] == records[1]["loss_mask"]


def test_streamed_events_carry_the_text_and_the_tool_call(served):
    client = served.client()
    events = list(client.responses.create(model=MODEL, input="hello", max_output_tokens=12, temperature=0,
                                          stream=True))  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert events[-1].response.status == "incomplete"  # 12 tokens cut the reply short: OpenAI's final event
    assert kinds[-1] == "response.incomplete"  # is then response.incomplete
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    stream = client.responses.create(
        model=MODEL, input=QUESTION, tools=[FLAT_ADD], temperature=0, stream=True
    )
    final = [e for e in stream if e.type == "response.completed"][0].response
    (call,) = [i for i in final.output if i.type == "function_call"]
    assert json.loads(call.arguments) == {"a": 2, "b": 3}


def test_what_responses_cannot_serve_is_a_400(served):
    client = served.client()
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_1")
    with pytest.raises(openai.BadRequestError, match="only function tools"):
        client.responses.create(model=MODEL, input="x", tools=[{"type": "web_search"}])
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-9", input="x")


def test_a_streamed_call_arrives_live_its_item_first_then_its_arguments_in_pieces(served):
    stream = served.client().responses.create(
        model=MODEL, input=QUESTION, tools=[FLAT_ADD], temperature=0, stream=True
    )
    events = list(stream)
    kinds = [e.type for e in events]
    added = kinds.index("response.output_item.added")
    assert events[added].item.type == "function_call" and events[added].item.name == "add"
    assert events[added].item.arguments == ""  # announced once the name is written, before its arguments
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and all(kinds.index(d.type) > added for d in deltas)  # pieces as written
    assert {d.item_id for d in deltas} == {events[added].item.id}
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert "".join(d.delta for d in deltas) == done.arguments
    assert json.loads(done.arguments) == {"a": 2, "b": 3}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    (call,) = events[-1].response.output
    assert call.id == events[added].item.id and call.status == "completed"
