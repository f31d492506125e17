"""Kimi's chat format with `tokenizer: checkpoint`: rendered text and token ids equal the checkpoint's own
jinja (Kimi K2 Instruct's template, rendered by transformers' jinja) on random conversations (system or the
default one, tools, multi-turn tool calls and results, named messages); rollouts stay append-only; the calls
the template writes parse back; malformed ones are error observations."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import AddedToken

from rz_agents import kimi_tokens as K
from rz_agents.envs.tool_calls import ToolCall, ToolCallError, parse_tool_calls
from rz_agents.model.chat_template import template_for
from rz_agents.model.kimi_chat import KIMI_CHAT_TEMPLATE, KimiChatTemplate, render_kimi_call
from rz_agents.model.tokenizer import Tokenizer, qwen3_tokenizer
from rz_agents.runtime.factories import build_tokenizer

# Kimi K2 Instruct's `chat_template` (moonshotai/Kimi-K2-Instruct, tokenizer_config.json), as quoted verbatim
# in public repositories found with the code search; see official_templates/README.md. Test data only.
OFFICIAL = (Path(__file__).parent / "official_templates" / "kimi_k2.jinja").read_text()
KIMI_TOKENS = [K.IM_USER, K.IM_ASSISTANT, K.IM_SYSTEM, K.IM_MIDDLE, K.EOS]
KIMI_TOKENS += [K.TOOL_CALLS_SECTION_BEGIN, K.TOOL_CALLS_SECTION_END, K.TOOL_CALL_BEGIN]
KIMI_TOKENS += [K.TOOL_CALL_ARGUMENT_BEGIN, K.TOOL_CALL_END]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code — stdout (ünïcödé).",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "k": {"type": "integer"},
                    "filters": {"type": "object"},
                },
            },
        },
    },
]
WORDS = ["Compute 2+3.", "日本語", "  spaced  ", "a\n\nb", '{"x": 1}', "ça va", "x = 1\nprint(x)", "😀", ""]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(our tokenizer, the template `tokenizer: checkpoint` picks, transformers' tokenizer) of a checkpoint
    directory whose vocabulary has Kimi's control tokens (added to Qwen3's BPE) and whose jinja is Kimi's."""
    transformers = pytest.importorskip("transformers")
    backend = qwen3_tokenizer().backend
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in KIMI_TOKENS])
    kimi = Tokenizer(backend, eos_token=K.IM_END, pad_token="<|endoftext|>", extra_eos_tokens=(K.EOS,))
    directory = kimi.save(tmp_path_factory.mktemp("kimi") / "checkpoint")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = OFFICIAL
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "config.json").write_text('{"model_type": "kimi_linear"}')
    tokenizer, template = build_tokenizer("checkpoint", str(directory))
    return tokenizer, template, transformers.AutoTokenizer.from_pretrained(str(directory))


def official(hf, messages, tools=None, tokenize=False, generation=True):
    """The checkpoint's own template through transformers (text, or its token ids)."""
    text = hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=generation)
    return hf.encode(text, add_special_tokens=False) if tokenize else text


def random_arguments(rng: random.Random) -> tuple[str, dict]:
    if rng.random() < 0.5:
        return "python", {"code": rng.choice(WORDS)}
    keys = rng.sample(["query", "k", "filters"], rng.randint(0, 3))
    values = {"query": rng.choice(WORDS), "k": rng.randint(0, 9), "filters": {"n": [1, None, True]}}
    return "search", {key: values[key] for key in keys}


def random_conversation(rng: random.Random) -> tuple[list[dict], list[dict] | None]:
    messages: list[dict] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(WORDS)})
    messages.append({"role": "user", "content": rng.choice(WORDS)})
    if rng.random() < 0.2:
        messages[-1]["name"] = "alice"
    calls = 0
    for _ in range(rng.randint(0, 3)):
        message: dict = {"role": "assistant", "content": rng.choice(WORDS)}
        ids = []
        if rng.random() < 0.6:
            message["tool_calls"] = []
            for _ in range(rng.randint(1, 2)):
                name, arguments = random_arguments(rng)
                ids.append(f"functions.{name}:{calls}")
                arguments_field = (
                    arguments if rng.random() < 0.5 else json.dumps(arguments, ensure_ascii=False)
                )
                function = {"name": name, "arguments": arguments_field}
                message["tool_calls"].append({"id": ids[-1], "type": "function", "function": function})
                calls += 1
        messages.append(message)
        messages += [{"role": "tool", "tool_call_id": i, "content": rng.choice(WORDS)} for i in ids]
        if not ids or rng.random() < 0.3:
            messages.append({"role": "user", "content": rng.choice(WORDS)})
    return messages, (TOOLS if rng.random() < 0.5 else None)


def test_tokenizer_checkpoint_picks_kimi_from_its_jinja_or_model_type(checkpoint):
    tokenizer, template, _ = checkpoint
    assert isinstance(template, KimiChatTemplate)
    assert template.stop_token_ids(tokenizer) == [
        tokenizer.token_to_id(K.IM_END),
        tokenizer.token_to_id(K.EOS),
    ]

    class NoJinja:
        chat_template = None

        def token_to_id(self, token):
            return tokenizer.token_to_id(token)

    assert template_for(NoJinja(), "kimi_linear") is KIMI_CHAT_TEMPLATE


def test_prompts_render_as_the_official_template_text_and_tokens(checkpoint):
    tokenizer, template, hf = checkpoint
    rng = random.Random(0)
    for _ in range(60):
        messages, tools = random_conversation(rng)
        generation = rng.random() < 0.8
        ours = template.render(messages, tools, add_generation_prompt=generation)
        assert ours == official(hf, messages, tools, generation=generation), messages
        assert template.encode_prompt(
            tokenizer, messages, tools, add_generation_prompt=generation
        ) == official(hf, messages, tools, tokenize=True, generation=generation)


def test_a_rollout_appends_tokens_and_equals_the_official_render_of_the_episode(checkpoint):
    """prompt + sampled + <|im_end|> + continuation ... == the official template over the whole episode."""
    tokenizer, template, hf = checkpoint
    rng = random.Random(1)
    for episode in range(12):
        messages = [{"role": "user", "content": f"task {episode}"}]
        tools = TOOLS if episode % 2 else None
        tokens = template.encode_prompt(tokenizer, messages, tools)
        stop = template.stop_token_ids(tokenizer)[0]
        for turn in range(rng.randint(1, 3)):
            name, arguments = random_arguments(rng)
            call = {"id": f"functions.{name}:{turn}", "function": {"name": name, "arguments": arguments}}
            written = f"Step {turn}." + K.TOOL_CALLS_SECTION_BEGIN + render_kimi_call(call, 0, turn)
            written += K.TOOL_CALLS_SECTION_END
            tokens += tokenizer.encode(written) + [stop]
            observation = [{"role": "tool", "tool_call_id": call["id"], "content": str(turn)}]
            tokens += template.encode_continuation(tokenizer, observation)
            messages += [{"role": "assistant", "content": written}, *observation]
            assert tokens == official(hf, messages, tools, tokenize=True), messages
            assert parse_tool_calls(written, TOOLS).calls == [ToolCall(name, arguments)]


def test_every_rendered_call_parses_back():
    rng = random.Random(2)
    for _ in range(100):
        calls = [random_arguments(rng) for _ in range(rng.randint(1, 3))]
        message = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"name": n, "arguments": a} for n, a in calls],
        }
        text = KIMI_CHAT_TEMPLATE.render(
            [{"role": "system", "content": ""}, message], add_generation_prompt=False
        )
        written = text.split(K.IM_MIDDLE)[-1].removesuffix(K.IM_END)
        assert f"{K.TOOL_CALL_BEGIN}functions.{calls[0][0]}:0{K.TOOL_CALL_ARGUMENT_BEGIN}" in written
        parsed = parse_tool_calls(written, TOOLS)
        assert not parsed.errors and [(c.name, c.arguments) for c in parsed.calls] == calls


def _section(*calls: str) -> str:
    return K.TOOL_CALLS_SECTION_BEGIN + "".join(calls) + K.TOOL_CALLS_SECTION_END


def _call(call_id: str, arguments: str) -> str:
    return f"{K.TOOL_CALL_BEGIN}{call_id}{K.TOOL_CALL_ARGUMENT_BEGIN}{arguments}{K.TOOL_CALL_END}"


@pytest.mark.parametrize(
    "text, message",
    [
        (_section(_call("functions.python:0", '{"code": "1"}'))[:-40], "unterminated tool call"),
        (
            _section(f"{K.TOOL_CALL_BEGIN}functions.python:0{{}}{K.TOOL_CALL_END}"),
            "needs <|tool_call_argument",
        ),
        (_section(_call("functions.python:0", '{"code": ')), "invalid JSON arguments for 'python'"),
        (_section(_call("functions.bash:0", '{"cmd": "ls"}')), "unknown tool 'bash'"),
        (_section(_call("functions.python:0", "{}")), "missing required argument"),
        (_section(_call("functions.search:0", '{"k": "3"}')), "must be of type integer"),
        (_section(_call("functions.python:0", "[" * 100000)), "nested too deeply"),
        (_section("just text"), "section without a tool call"),
    ],
)
def test_malformed_kimi_calls_are_error_observations_not_exceptions(text, message):
    parsed = parse_tool_calls("thinking about <|tool_call_begin|> it</think>" + text, TOOLS)
    assert parsed.has_calls and not parsed.calls and len(parsed.errors) == 1
    assert isinstance(parsed.errors[0], ToolCallError) and message in parsed.errors[0].message


def test_a_bad_kimi_call_does_not_hide_the_good_ones():
    text = "Doing both." + _section(
        _call("functions.python:0", '{"code": "1"}'),
        _call("functions.search:1", '{"k": "x"}'),
        _call(" search:2 ", '{"query": "q"}'),  # an id without the functions. prefix still names the tool
    )
    parsed = parse_tool_calls(text + " done", TOOLS)
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("python", {"code": "1"}),
        ("search", {"query": "q"}),
    ]
    assert isinstance(parsed.items[1], ToolCallError) and parsed.trailing_text == "done"


@pytest.mark.parametrize(
    "messages, match",
    [
        ([{"role": "assistant", "content": "", "tool_calls": [{"name": "python"}]}], "no 'arguments'"),
        (
            [{"role": "assistant", "content": "", "tool_calls": [{"arguments": {}}]}],
            "without a function name",
        ),
        ([{"role": "assistant", "content": "", "tool_calls": "python"}], "must be a list"),
        ([{"role": "robot", "content": "hi"}], "role must be one of"),
    ],
)
def test_bad_messages_are_refused_in_one_line(messages, match):
    with pytest.raises((TypeError, ValueError), match=match):
        KIMI_CHAT_TEMPLATE.render(messages)
