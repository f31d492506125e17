"""DeepSeek-V3.1's chat and tool-call format: the published template's rendering, append-only round trips,
parsing (malformed output gives an error observation, never an exception) and selection by `template_for`."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from rz_agents.envs.tool_calls import ToolCallError, parse_tool_calls
from rz_agents.model.chat_template import QWEN3_CHAT_TEMPLATE, template_for
from rz_agents.model.deepseek_chat import (
    ASSISTANT,
    BOS,
    EOS,
    TOOL_CALL_BEGIN,
    TOOL_CALL_END,
    TOOL_CALLS_BEGIN,
    TOOL_CALLS_END,
    TOOL_SEP,
    USER,
)
from rz_agents.model.deepseek_chat import DEEPSEEK_V31_CHAT_TEMPLATE as DS

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Echo text",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        },
    },
]


def test_rendering_equals_the_published_deepseek_v31_template():
    """Expected string: DeepSeek-V3.1's tokenizer_config.json chat_template (deepseek-ai/DeepSeek-V3.1 on the
    Hugging Face Hub; the jinja as logged in ik_llama.cpp's issue threads) applied by hand with thinking=False
    and add_generation_prompt=True: bos + system, "<｜User｜>"+content, "<｜Assistant｜></think>" after a
    user turn, content + tool-call tokens + "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>", tool outputs, the
    assistant continuing after them with no header, and the generation prompt after the last user turn."""
    messages = [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "What is 2+3?"},
        {
            "role": "assistant",
            "content": "Let me compute.",
            "tool_calls": [
                {"type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
            ],
        },
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "2+3 = 5."},
        {"role": "user", "content": "Thanks"},
    ]
    expected = (
        "<｜begin▁of▁sentence｜>You are a helpful assistant<｜User｜>What is 2+3?<｜Assistant｜></think>"
        'Let me compute.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 2, "b": 3}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁output▁begin｜>5<｜tool▁output▁end｜>"
        "2+3 = 5.<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜></think>"
    )
    assert DS.render(messages, enable_thinking=False) == expected
    # thinking on: the published template's generation prompt opens "<think>"
    assert DS.render(messages[:2]).endswith("<｜User｜>What is 2+3?<｜Assistant｜><think>")
    # no generation prompt after tool results (the published template adds none there)
    assert DS.render(messages[:4], enable_thinking=False).endswith("<｜tool▁output▁end｜>")


def test_tools_block_goes_into_the_system_prompt():
    text = DS.render([{"role": "user", "content": "hi"}], tools=TOOLS, enable_thinking=False)
    assert text.startswith(BOS + "\n\n## Tools\nYou have access to the following tools:\n\n### add\n")
    assert 'Parameters: {"type": "object", "properties": {"a": {"type": "integer"}' in text
    assert text.endswith(f"chain them directly without separators or spaces\n{USER}hi{ASSISTANT}</think>")


def _random_conversation(rng: random.Random, thinking: bool) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": "sys"}] if rng.random() < 0.5 else []
    messages.append({"role": "user", "content": f"q{rng.randrange(100)}"})
    for _ in range(rng.randrange(1, 5)):
        calls = [
            {"function": {"name": "add", "arguments": {"a": rng.randrange(9), "b": rng.randrange(9)}}}
            for _ in range(rng.randrange(0, 3))
        ]
        turn: dict = {"role": "assistant", "content": rng.choice(["", "ok", "Let me see.\n"])}
        if calls:
            turn["tool_calls"] = calls
        if thinking and rng.random() < 0.5 and messages[-1]["role"] == "user":
            turn["reasoning_content"] = "hmm"
        messages.append(turn)
        if calls:
            messages += [{"role": "tool", "content": str(i)} for i in range(len(calls))]
        else:
            messages.append({"role": "user", "content": "more"})
    return messages


@pytest.mark.parametrize("thinking", [False, True])
def test_render_is_append_only_and_every_assistant_turn_parses_back(thinking):
    rng = random.Random(7)
    for _ in range(50):
        messages = _random_conversation(rng, thinking)
        full = DS.render(messages, tools=TOOLS, add_generation_prompt=False, enable_thinking=thinking)
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        text = DS.render(messages[:first], tools=TOOLS, enable_thinking=thinking)
        i = first
        while i < len(messages):
            turn = messages[i]
            # what the model wrote: the assistant turn's rendering after the prompt, up to and with its EOS
            written = DS.render(
                messages[: i + 1], tools=TOOLS, add_generation_prompt=False, enable_thinking=thinking
            )[len(text) :]
            assert written.endswith(EOS) and ASSISTANT not in written
            parsed = parse_tool_calls(written[: -len(EOS)], TOOLS)
            want = [(c["function"]["name"], c["function"]["arguments"]) for c in turn.get("tool_calls", [])]
            assert [(c.name, c.arguments) for c in parsed.calls] == want and not parsed.errors
            j = i + 1
            while j < len(messages) and messages[j]["role"] != "assistant":
                j += 1
            text += written + DS.render_continuation(messages[i + 1 : j], enable_thinking=thinking)
            i = j
        # the incremental text is the full rendering plus the last generation prompt
        assert text.startswith(full) and text[len(full) :] in ("", DS.generation_prompt(thinking))


def test_reasoning_renders_where_the_model_wrote_it():
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "A", "reasoning_content": "think"},
    ]
    assert DS.render(messages, add_generation_prompt=False).endswith(f"{ASSISTANT}<think>think</think>A{EOS}")
    parsed = parse_tool_calls(
        "think</think>"
        + TOOL_CALLS_BEGIN
        + TOOL_CALL_BEGIN
        + "echo"
        + TOOL_SEP
        + '{"text": "x"}'
        + TOOL_CALL_END
        + TOOL_CALLS_END,
        TOOLS,
    )
    assert [(c.name, c.arguments) for c in parsed.calls] == [("echo", {"text": "x"})]


def _call(name: str, args: str) -> str:
    return f"{TOOL_CALL_BEGIN}{name}{TOOL_SEP}{args}{TOOL_CALL_END}"


@pytest.mark.parametrize(
    "text, message",
    [
        (TOOL_CALLS_BEGIN + TOOL_CALL_BEGIN + 'add<｜tool▁sep｜>{"a": 1', "unterminated tool call"),
        (
            TOOL_CALLS_BEGIN + _call("add", '{"a": 1, "b": }') + TOOL_CALLS_END,
            "invalid JSON arguments for 'add'",
        ),
        (TOOL_CALLS_BEGIN + f"{TOOL_CALL_BEGIN}add {{}}{TOOL_CALL_END}" + TOOL_CALLS_END, "<tool_sep>"),
        (TOOL_CALLS_BEGIN + _call("mul", '{"a": 1}') + TOOL_CALLS_END, "unknown tool 'mul'"),
        (TOOL_CALLS_BEGIN + _call("add", '{"a": 1}') + TOOL_CALLS_END, "missing required argument"),
        (TOOL_CALLS_BEGIN + _call("add", "[1, 2]") + TOOL_CALLS_END, "must be a JSON object"),
        (TOOL_CALLS_BEGIN + _call("add", "[" * 100000) + TOOL_CALLS_END, "invalid JSON"),
        (TOOL_CALLS_BEGIN + "just text", "without a tool call"),
    ],
)
def test_malformed_output_is_an_error_observation_not_an_exception(text, message):
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.has_calls and not parsed.calls and len(parsed.errors) == 1
    assert isinstance(parsed.errors[0], ToolCallError) and message in parsed.errors[0].message


def test_a_bad_call_does_not_hide_the_good_ones():
    text = (
        TOOL_CALLS_BEGIN
        + _call("add", '{"a": 1, "b": 2}')
        + _call("add", "{bad")
        + _call("echo", json.dumps({"text": "hi"}))
        + TOOL_CALLS_END
        + " done"
    )
    parsed = parse_tool_calls(text, TOOLS)
    assert [c.name for c in parsed.calls] == ["add", "echo"] and len(parsed.errors) == 1
    assert isinstance(parsed.items[1], ToolCallError) and parsed.trailing_text == "done"


def test_system_message_after_turns_is_refused_in_one_line():
    with pytest.raises(ValueError, match="system message") as err:
        DS.render([{"role": "user", "content": "q"}, {"role": "system", "content": "s"}])
    assert "\n" not in str(err.value)


class _Vocab:
    """A tokenizer stand-in for template selection and stop ids: only token_to_id is used."""

    def __init__(self, tokens: list[str], chat_template: str | None):
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.chat_template = chat_template

    def token_to_id(self, token: str) -> int | None:
        return self.ids.get(token)


def test_template_for_selects_deepseek_v31_and_refuses_other_deepseek_formats():
    v31 = "{{ bos_token }}{%- if ns.is_last_user %}{{'<｜Assistant｜></think>'}}{%- endif %}"
    assert template_for(SimpleNamespace(chat_template=v31)) is DS
    assert DS.stop_token_ids(_Vocab(["a", EOS], v31)) == [1]
    with pytest.raises(ValueError, match="does not use DeepSeek's chat format"):
        DS.stop_token_ids(_Vocab(["a"], v31))
    dsml = _Vocab([BOS, EOS, USER, ASSISTANT], None)  # V3.2 / V4: no jinja template shipped
    with pytest.raises(ValueError, match="no jinja chat template"):
        template_for(dsml)
    assert template_for(_Vocab(["<|im_start|>"], None)) is QWEN3_CHAT_TEMPLATE


@pytest.fixture(scope="module")
def deepseek_tokenizer():
    """Qwen3's BPE with DeepSeek-V3.1's control tokens added as special tokens (atomic, as in V3.1's)."""
    import tokenizers

    from rz_agents.model.deepseek_chat import (
        THINK_CLOSE,
        THINK_OPEN,
        TOOL_OUTPUT_BEGIN,
        TOOL_OUTPUT_END,
    )
    from rz_agents.model.tokenizer import Tokenizer, qwen3_tokenizer

    backend = tokenizers.Tokenizer.from_str(qwen3_tokenizer().backend.to_str())
    specials = [
        BOS,
        EOS,
        USER,
        ASSISTANT,
        TOOL_CALLS_BEGIN,
        TOOL_CALLS_END,
        TOOL_CALL_BEGIN,
        TOOL_CALL_END,
        TOOL_SEP,
        TOOL_OUTPUT_BEGIN,
        TOOL_OUTPUT_END,
        THINK_OPEN,
        THINK_CLOSE,
    ]
    backend.add_special_tokens(specials)
    v31 = "{{ bos_token }}{%- if ns.is_last_user %}{{'<｜Assistant｜></think>'}}{%- endif %}"
    return Tokenizer(backend, eos_token=EOS, bos_token=BOS, chat_template=v31)


@pytest.mark.parametrize("thinking", [False, True])
def test_prompt_sampled_and_continuation_tokens_equal_the_full_conversation(deepseek_tokenizer, thinking):
    tok, rng = deepseek_tokenizer, random.Random(11)
    for _ in range(20):
        messages = _random_conversation(rng, thinking)
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        ids = DS.encode_prompt(tok, messages[:first], TOOLS, enable_thinking=thinking)
        prefix = DS.render(messages[:first], TOOLS, enable_thinking=thinking)
        i = first
        while i < len(messages):
            full = DS.render(messages[: i + 1], TOOLS, add_generation_prompt=False, enable_thinking=thinking)
            sampled = tok.encode(full[len(prefix) :])  # the model's tokens, ending with EOS
            assert sampled[-1] == DS.stop_token_ids(tok)[0]
            j = i + 1
            while j < len(messages) and messages[j]["role"] != "assistant":
                j += 1
            ids += sampled + DS.encode_continuation(tok, messages[i + 1 : j], enable_thinking=thinking)
            prefix = DS.render(messages[:j], TOOLS, enable_thinking=thinking)
            i = j
        assert ids == tok.encode(prefix)
    # a turn cut off before its EOS: the EOS id goes in front of the continuation
    cut = DS.encode_continuation(tok, [{"role": "user", "content": "go on"}], assistant_closed=False)
    assert cut[0] == tok.token_to_id(EOS) and cut[1] == tok.token_to_id(USER)


def test_a_checkpoint_tokenizer_with_the_v31_template_gets_deepseek_format(deepseek_tokenizer, tmp_path):
    from rz_agents.model.deepseek_v4_config import DeepseekV4Config
    from rz_agents.runtime.factories import build_tokenizer

    directory = deepseek_tokenizer.save(tmp_path / "ckpt")
    (directory / "config.json").write_text(json.dumps(DeepseekV4Config.tiny().to_hf()))
    tok, template = build_tokenizer("checkpoint", str(directory))
    assert template is DS and tok.encode(BOS + USER) == deepseek_tokenizer.encode(BOS + USER)
