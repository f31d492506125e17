"""``rz serve`` reads and writes tool calls in the format its policy's chat template names: Qwen3.5's XML form
and Kimi's tool-call section, besides Qwen3's JSON.

The servers here are real ``OpenAIServer`` / ``RZEngine`` pairs over tiny random qwen3_5 / kimi_linear
policies whose tokenizers get the family's template as a checkpoint's would (``template_for`` its
model_type). A reply is a real token stream: the tokens the template renders for an assistant tool call
(with Kimi's call markers as special tokens), run through the server's own decode, parse and per-step
streaming code; one request per family goes end to end through the openai SDK (history with calls and
results rendered in the family's format; a named tool_choice forcing the call's opening in that format)."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import AddedToken

from rz_agents import kimi_tokens as K
from rz_agents.engine import Completion, EngineConfig, RZEngine
from rz_agents.model.chat_template import template_for
from rz_agents.model.policy import PolicySpec, build_policy
from rz_agents.model.tokenizer import Tokenizer, qwen3_tokenizer
from rz_agents.serve import OpenAIServer, ServerThread
from rz_agents.serve.openai_schema import OpenAIError, chat_messages, parse_chat
from rz_agents.serve.tool_formats import FORMATS
from rz_agents.serve.xml_tool_stream import XmlCallStream

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "note": {"type": "string"}},
        },
    },
}
ARGUMENTS = {"a": 2, "b": 3, "note": "sum: {x}\n é"}
QUESTION = [{"role": "user", "content": "2+3?"}]
# what each family's model writes for the call (its template's own rendering of it, thinking first for
# Qwen3.5, whose generation prompt opened the think block)
REPLIES = {
    "qwen3_5": (
        "Adding.\n</think>\n\n<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n"
        "<parameter=b>\n3\n</parameter>\n<parameter=note>\nsum: {x}\n é\n</parameter>\n</function>\n"
        "</tool_call>"
    ),
    "kimi_linear": (
        f"Adding.{K.TOOL_CALLS_SECTION_BEGIN}{K.TOOL_CALL_BEGIN}functions.add:0{K.TOOL_CALL_ARGUMENT_BEGIN}"
        f"{json.dumps(ARGUMENTS, ensure_ascii=False)}{K.TOOL_CALL_END}{K.TOOL_CALLS_SECTION_END}"
    ),
}
KIMI_TOKENS = [K.IM_USER, K.IM_ASSISTANT, K.IM_SYSTEM, K.IM_MIDDLE, K.EOS, K.TOOL_CALLS_SECTION_BEGIN]
KIMI_TOKENS += [K.TOOL_CALLS_SECTION_END, K.TOOL_CALL_BEGIN, K.TOOL_CALL_ARGUMENT_BEGIN, K.TOOL_CALL_END]


def _server(family: str) -> OpenAIServer:
    """An rz serve server over a tiny random `family` policy whose tokenizer has no jinja, so the
    checkpoint's model_type picks the family's chat template (``template_for``, as ``rz serve CHECKPOINT``
    does through config.json; kept in memory: writing and reading the 151k-token checkpoint costs seconds)."""
    backend = qwen3_tokenizer().backend
    extra: tuple[str, ...] = ()
    if family == "kimi_linear":  # Kimi's control tokens are special: a plain decode drops them
        backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in KIMI_TOKENS])
        extra = (K.EOS,)
    tokenizer = Tokenizer(backend, eos_token="<|im_end|>", pad_token="<|endoftext|>", extra_eos_tokens=extra)
    model = build_policy(PolicySpec(model_type=family, vocab_size=len(tokenizer)))  # seeded random weights
    config = EngineConfig(max_running=2, max_len=1024, num_threads=1)
    engine = RZEngine(model.eval().requires_grad_(False), config, decode=tokenizer.decode)
    return OpenAIServer(engine, tokenizer, template_for(tokenizer, family), model_name="ckpt")


@pytest.fixture(scope="module", params=["qwen3_5", "kimi_linear"])
def served(request):
    return request.param, _server(request.param)


def _request(messages, **body):
    return parse_chat({"model": "ckpt", "messages": messages, "tools": [ADD], **body})


def _reply_tokens(server, family: str) -> list[int]:
    return server.tokenizer.encode(REPLIES[family]) + [server.stops[0]]


def test_the_template_names_the_parser(served):
    family, server = served
    assert server.tool_format.name == {"qwen3_5": "xml", "kimi_linear": "kimi"}[family]


def test_a_reply_in_the_family_format_becomes_openai_tool_calls_that_render_back_to_its_tokens(served):
    family, server = served
    req = _request(QUESTION)
    prompt = server._render(req)
    tokens = _reply_tokens(server, family)
    completion = Completion(prompt, tokens, torch.zeros(len(tokens)), [0] * len(tokens), "stop")
    choice = server._choice(completion, req)
    (call,) = choice.tool_calls
    assert call["function"]["name"] == "add" and json.loads(call["function"]["arguments"]) == ARGUMENTS
    assert server._finish(choice) == "tool_calls"
    if family == "kimi_linear":
        assert call["id"] == "functions.add:0" and choice.content == "Adding."  # the model's own call id
    else:
        assert choice.content == "Adding.\n</think>\n\n"  # the reasoning stays in the content, as for Qwen3
    # the history a client sends back (no session) renders the tokens the model sampled, then the result
    message = json.loads(json.dumps(server._assistant_message(choice)))
    result = {"role": "tool", "tool_call_id": call["id"], "content": "5"}
    history = server._render(_request([*QUESTION, message, result]))
    assert history[: len(prompt) + len(tokens)] == prompt + tokens
    if family == "kimi_linear":
        assert "## Return of functions.add:0" in server.tokenizer.decode(history[len(prompt) :])


def test_streamed_calls_are_announced_once_and_their_argument_pieces_make_the_arguments(served):
    family, server = served
    req = _request(QUESTION)
    tokens = _reply_tokens(server, family)
    stream = server.tool_format.stream(req.tools)
    deltas = []
    for k in range(1, len(tokens) + 1):  # one engine step at a time, as chat_stream polls
        for chunk in server._call_deltas({}, 0, stream, "", tokens[:k]):
            deltas += chunk["choices"][0]["delta"]["tool_calls"]
    head, *pieces = deltas
    assert head["function"] == {"name": "add", "arguments": ""} and len(pieces) >= 2
    arguments = "".join(p["function"]["arguments"] for p in pieces)
    completion = Completion([], tokens, torch.zeros(len(tokens)), [0] * len(tokens), "stop")
    (final,) = server._choice(completion, req).tool_calls
    assert json.loads(arguments) == ARGUMENTS
    if family == "qwen3_5":
        assert arguments == final["function"]["arguments"]  # piece by piece, the non-streamed arguments
    else:
        assert head["id"] == final["id"] == "functions.add:0"


def test_an_end_to_end_request_renders_the_history_and_forces_the_named_call_in_the_family_format(served):
    import openai

    family, server = served
    http = ServerThread(server).start()
    try:
        client = openai.OpenAI(base_url=http.url, api_key="unused", max_retries=0)
        call = {"id": "functions.add:0", "type": "function",
                "function": {"name": "add", "arguments": json.dumps(ARGUMENTS)}}  # fmt: skip
        messages = [
            *QUESTION,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "functions.add:0", "content": "5"},
        ]
        r = client.chat.completions.create(
            model="ckpt", messages=messages, tools=[ADD], max_tokens=2, temperature=0,
            tool_choice={"type": "function", "function": {"name": "add"}},
            extra_body={"return_token_ids": True},
        )  # fmt: skip
        prompt = r.model_extra["prompt_token_ids"]
        tok, tpl = server.tokenizer, server.template
        history = tpl.encode_prompt(tok, chat_messages(messages), tools=[ADD])
        opening = {
            "qwen3_5": "\n</think>\n\n<tool_call>\n<function=add>\n",
            "kimi_linear": f"{K.TOOL_CALLS_SECTION_BEGIN}{K.TOOL_CALL_BEGIN}functions.add:1"
            f"{K.TOOL_CALL_ARGUMENT_BEGIN}",
        }[family]
        assert prompt == history + tok.encode(opening)  # the call's opening as context, in the format
        text = tok.decode(prompt)
        assert ("## Return of functions.add:0" if family == "kimi_linear" else "<parameter=a>\n2\n") in text
        chunks = list(
            client.chat.completions.create(
                model="ckpt", messages=messages, tools=[ADD], max_tokens=2, temperature=0, stream=True
            )
        )
        assert chunks[-1].choices[0].finish_reason in ("length", "stop", "tool_calls")
    finally:
        http.stop()


def test_the_xml_stream_holds_each_parameter_until_it_closes():
    stream, sent = XmlCallStream([ADD]), []
    text = REPLIES["qwen3_5"]
    for end in range(1, len(text) + 1):
        sent += [(end, d) for d in stream.update(text[:end])]
    pieces = [(end, d["function"]["arguments"]) for end, d in sent if "id" not in d]
    assert [p for _, p in pieces] == ['{"a": 2', ', "b": 3', ', "note": "sum: {x}\\n é"', "}"]
    assert pieces[0][0] == text.index("</parameter>") + len("</parameter>")  # not before the value closes
    assert _feed_xml("<tool_call>\n<function=ad") == []  # the name is not complete yet


def _feed_xml(text: str) -> list:
    stream, out = XmlCallStream([ADD]), []
    for end in range(1, len(text) + 1):
        out += stream.update(text[:end])
    return out


def test_forcing_a_call_in_a_format_that_cannot_be_forced_is_a_clear_400():
    with pytest.raises(OpenAIError, match="not supported for the dsml tool-call format") as e:
        FORMATS["dsml"].forced_start("add", 0, False)
    assert e.value.status == 400 and e.value.param == "tool_choice"
