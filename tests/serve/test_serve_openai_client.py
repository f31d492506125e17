"""The official openai client against `rz serve`: models, chat, tools, streaming, logprobs, n > 1, text
completions; every token and log-prob equals the in-process engine's, and the learner's lag-0 re-scoring
of them is bit-identical (torch.equal)."""

from __future__ import annotations

import json

import pytest
import torch
from serve_fixtures import ADD_TOOL, ANSWER_TEXT, MODEL, QUESTION, Served, learner_logprobs

from rz_agents.engine import SamplingParams, generate_batch


@pytest.fixture(scope="module")
def served():
    s = Served()
    yield s
    s.stop()


def _engine_completion(served, prompt, **params):
    engine = served.fresh_engine()
    stops = tuple(served.template.stop_token_ids(served.tokenizer))
    (out,) = generate_batch(engine, [prompt], SamplingParams(stop_token_ids=stops, **params))
    return out


def test_models_lists_the_served_model(served):
    models = served.client().models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_tokens_and_logprobs_equal_the_engine_and_the_learner_bit_for_bit(served):
    messages = [{"role": "user", "content": "hello there"}]
    r = served.client().chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0.9, top_p=0.95, seed=7, logprobs=True,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    choice = r.choices[0]
    prompt = r.model_extra["prompt_token_ids"]
    ids = choice.model_extra["token_ids"]
    assert prompt == served.template.encode_prompt(served.tokenizer, messages)
    got = torch.tensor([e.logprob for e in choice.logprobs.content], dtype=torch.float32)
    ref = _engine_completion(served, prompt, temperature=0.9, top_p=0.95, max_tokens=12, seed=7)
    assert ids == ref.tokens and torch.equal(got, ref.logprobs)
    assert choice.model_extra["versions"] == [0] * len(ids)
    lp = learner_logprobs(served.learner_model, prompt + ids, temperature=0.9, top_p=0.95)
    assert torch.equal(lp[len(prompt) - 1 :], got)  # lag-0 |dlogp| is exactly 0
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(ids)


def test_n_choices_are_distinct_seeded_samples_each_equal_to_the_engine(served):
    messages = [{"role": "user", "content": "pick"}]
    r = served.client().chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, n=3, seed=100, logprobs=True,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    assert len(r.choices) == 3
    prompt = r.model_extra["prompt_token_ids"]
    seqs = [c.model_extra["token_ids"] for c in r.choices]
    assert len({tuple(s) for s in seqs}) > 1
    for i, c in enumerate(r.choices):
        ref = _engine_completion(served, prompt, max_tokens=8, seed=100 + i)
        assert seqs[i] == ref.tokens
        assert torch.equal(torch.tensor([e.logprob for e in c.logprobs.content]), ref.logprobs)


def test_top_logprobs_hold_the_sampled_token_with_its_exact_logprob_when_it_is_the_argmax(served):
    r = served.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], tools=[ADD_TOOL], max_tokens=6,
        temperature=0, logprobs=True, top_logprobs=3,
    )  # fmt: skip
    for entry in r.choices[0].logprobs.content:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy: the sampled token is the argmax
        assert entry.top_logprobs[0].logprob == entry.logprob  # the rescoring forward equals the engine's


def test_tool_call_is_parsed_and_the_multi_turn_tool_conversation_completes(served):
    # A session keeps the sampled call as tokens: the byte chat format renders no tool_calls field, so a
    # stateless second request could not show the model its own call.
    client = served.client(default_headers={"X-RZ-Session": "tool-conversation"})
    messages = [{"role": "user", "content": QUESTION}]
    r = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[ADD_TOOL], temperature=0, max_tokens=80
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert call.id.startswith("call_") and choice.message.content is None
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    r2 = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[ADD_TOOL], temperature=0, max_tokens=40
    )
    assert r2.choices[0].message.content == ANSWER_TEXT and r2.choices[0].finish_reason == "stop"
    # tool_choice "none": the same text, not parsed
    r3 = served.client().chat.completions.create(
        model=MODEL, messages=messages[:1], tools=[ADD_TOOL], tool_choice="none", temperature=0, max_tokens=80
    )
    assert r3.choices[0].message.tool_calls is None and "<tool_call>" in r3.choices[0].message.content


@pytest.mark.parametrize("tools", [None, [ADD_TOOL]], ids=["plain", "with-tools"])
def test_streaming_yields_the_same_text_tokens_and_logprobs_as_the_whole_answer(served, tools):
    client = served.client()
    kw = dict(
        model=MODEL, messages=[{"role": "user", "content": "stream me"}], max_tokens=16, seed=3, logprobs=True
    )
    if tools:  # text is held back while it could be the start of a <tool_call>, then flushed
        kw["tools"] = tools
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    lps = [
        e.logprob
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert text == whole.choices[0].message.content
    assert lps == [e.logprob for e in whole.choices[0].logprobs.content]
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_streaming_a_tool_call_sends_it_as_a_tool_calls_delta(served):
    chunks = list(
        served.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": QUESTION}], tools=[ADD_TOOL], temperature=0,
            max_tokens=80, stream=True,
        )
    )  # fmt: skip
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)  # the call's markup is not content
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [tc.function.name for tc in calls if tc.function.name] == ["add"]  # one call, its name once
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    pieces = [tc.function.arguments for tc in calls if tc.function.arguments]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == {"a": 2, "b": 3}  # arguments as written
    assert {tc.id for tc in calls if tc.id} == {calls[0].id} and {tc.index for tc in calls} == {0}


def test_text_completions_equal_the_engine_for_text_and_token_prompts(served):
    client = served.client()
    prompt_ids = served.tokenizer.encode("abc")
    r = client.completions.create(
        model=MODEL, prompt=["abc", prompt_ids], max_tokens=6, seed=5, logprobs=2,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    assert len(r.choices) == 2
    ref = SamplingParams(max_tokens=6, seed=5)
    (out,) = generate_batch(served.fresh_engine(), [prompt_ids], ref)
    for c in r.choices:
        assert c.model_extra["token_ids"] == out.tokens
        assert torch.equal(torch.tensor(c.logprobs.token_logprobs, dtype=torch.float32), out.logprobs)
        assert len(c.logprobs.top_logprobs) == len(out.tokens)


def test_concurrent_requests_batch_together_in_the_engine(served):
    import concurrent.futures

    client = served.client()
    steps_before = served.engine.counters["steps"]

    def one(i):
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"q{i}"}], max_tokens=10, seed=i,
            extra_body={"return_token_ids": True},
        )  # fmt: skip

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    generated = sum(len(r.choices[0].model_extra["token_ids"]) for r in results)
    steps = served.engine.counters["steps"] - steps_before
    assert steps < generated  # more than one sequence per engine step: they were batched
