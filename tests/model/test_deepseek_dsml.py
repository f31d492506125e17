"""DeepSeek-V3.2 / V4 chat format with DSML tool calls: the published encoders' rendering, append-only round
trips of random conversations, parsing (malformed calls give error observations, good ones beside them are
kept) and selection by `template_for` / `tokenizer: checkpoint` from the checkpoint's model_type."""

from __future__ import annotations

import json
import random

import pytest

from rz_agents.deepseek_tokens import ASSISTANT, BOS, EOS, THINK_CLOSE, THINK_OPEN, USER
from rz_agents.envs.tool_calls import ToolCall, ToolCallError, parse_tool_calls
from rz_agents.model.chat_template import template_for
from rz_agents.model.deepseek_dsml import (
    DEEPSEEK_V4_CHAT_TEMPLATE,
    DEEPSEEK_V32_CHAT_TEMPLATE,
    DsmlChatTemplate,
)

D = "\uff5cDSML\uff5c"
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
            "name": "put",
            "description": "Store any JSON value under a path",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "data": {}},
                "required": ["path"],
            },
        },
    },
]
SCHEMAS = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in TOOLS)
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "What is 2+3?"},
    {
        "role": "assistant",
        "content": "Let me compute.",
        "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}],
    },
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "2+3 = 5."},
    {"role": "user", "content": "Thanks"},
]
ADD_CALL = (
    f'<{D}invoke name="add">\n<{D}parameter name="a" string="false">2</{D}parameter>\n'
    f'<{D}parameter name="b" string="false">3</{D}parameter>\n</{D}invoke>'
)


def test_v4_rendering_equals_the_published_encoder():
    """Expected strings: DeepSeek-V4's published encoder (``encoding/encoding_dsv4.py`` of the V4 releases, as
    vLLM / SGLang copy it) applied by hand to CONVERSATION with the tools on the system message:
    ``encode_messages(messages, thinking_mode="chat")`` and ``thinking_mode="thinking"`` (tools given, so its
    drop_thinking is off: every user turn opens ``<think>`` and every assistant turn keeps its reasoning);
    its TOOLS_TEMPLATE with the schemas as JSON lines; the tool result merged into a user turn."""
    tools_block = (
        "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke "
        f'tools by writing a "<{D}tool_calls>" block like the following:\n\n<{D}tool_calls>\n'
        f'<{D}invoke name="$TOOL_NAME">\n<{D}parameter name="$PARAMETER_NAME" string="true|false">'
        f'$PARAMETER_VALUE</{D}parameter>\n...\n</{D}invoke>\n<{D}invoke name="$TOOL_NAME2">\n...\n'
        f"</{D}invoke>\n</{D}tool_calls>\n\n"
        'String parameters should be specified as is and set `string="true"`. For all other types (numbers, '
        'booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\n'
        "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
        "<think>...</think> BEFORE any tool calls or final response.\n\n"
        "Otherwise, output directly after </think> with tool calls or final response.\n\n"
        f"### Available Tool Schemas\n\n{SCHEMAS}\n\n"
        "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
    )
    chat = (
        f"{BOS}You are a helpful assistant\n\n{tools_block}"
        f"{USER}What is 2+3?{ASSISTANT}</think>Let me compute.\n\n<{D}tool_calls>\n{ADD_CALL}\n"
        f"</{D}tool_calls>{EOS}{USER}<tool_result>5</tool_result>{ASSISTANT}</think>2+3 = 5.{EOS}"
        f"{USER}Thanks{ASSISTANT}</think>"
    )
    assert DEEPSEEK_V4_CHAT_TEMPLATE.render(CONVERSATION, TOOLS, enable_thinking=False) == chat
    messages = [dict(m) for m in CONVERSATION]
    messages[2]["reasoning_content"] = "Use the tool."
    thinking = (
        f"{BOS}You are a helpful assistant\n\n{tools_block}"
        f"{USER}What is 2+3?{ASSISTANT}<think>Use the tool.</think>Let me compute.\n\n<{D}tool_calls>\n"
        f"{ADD_CALL}\n</{D}tool_calls>{EOS}{USER}<tool_result>5</tool_result>{ASSISTANT}<think></think>"
        f"2+3 = 5.{EOS}{USER}Thanks{ASSISTANT}<think>"
    )
    assert DEEPSEEK_V4_CHAT_TEMPLATE.render(messages, TOOLS) == thinking
    # two results, then user text: one merged user turn, blocks joined by blank lines
    two = [
        {"role": "tool", "content": "1"},
        {"role": "tool", "content": "2"},
        {"role": "user", "content": "go"},
    ]
    assert DEEPSEEK_V4_CHAT_TEMPLATE.render_continuation(two, enable_thinking=False) == (
        f"{USER}<tool_result>1</tool_result>\n\n<tool_result>2</tool_result>\n\ngo{ASSISTANT}</think>"
    )


def test_v32_rendering_equals_the_published_encoder():
    """Expected string: DeepSeek-V3.2's published encoder (``encoding/encoding_dsv32.py`` of
    deepseek-ai/DeepSeek-V3.2; vLLM's ``deepseek_v32_encoding.py`` copies it) applied by hand to CONVERSATION
    with ``thinking_mode="chat"``: its TOOLS_SYSTEM_TEMPLATE, ``function_calls`` blocks, tool results in
    ``<function_results>`` followed by ``\\n\\n</think>`` and the assistant continuing with no header."""
    tools_block = (
        "## Tools\n\nYou have access to a set of tools you can use to answer the user's question.\n"
        f'You can invoke functions by writing a "<{D}function_calls>" block like the following as part of '
        f'your reply to the user:\n<{D}function_calls>\n<{D}invoke name="$FUNCTION_NAME">\n'
        f'<{D}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{D}parameter>\n...\n'
        f'</{D}invoke>\n<{D}invoke name="$FUNCTION_NAME2">\n...\n</{D}invoke>\n</{D}function_calls>\n\n'
        "String and scalar parameters should be specified as is without any escaping or quotes, while lists "
        'and objects should use JSON format. The "string" attribute should be set to "true" for string type '
        'parameters and "false" for other types (numbers, booleans, arrays, objects).\n\n'
        "If the thinking_mode is enabled, then after function results you should strongly consider "
        "outputting a thinking block. Here is an example:\n\n"
        f"<{D}function_calls>\n...\n</{D}function_calls>\n\n"
        "<function_results>\n...\n</function_results>\n\n<think>...thinking about results</think>\n\n"
        f"Here are the functions available in JSONSchema format:\n<functions>\n{SCHEMAS}\n</functions>\n"
    )
    expected = (
        f"{BOS}You are a helpful assistant\n\n{tools_block}"
        f"{USER}What is 2+3?{ASSISTANT}</think>Let me compute.\n\n<{D}function_calls>\n{ADD_CALL}\n"
        f"</{D}function_calls>{EOS}\n\n<function_results>\n<result>5</result>\n</function_results>\n\n</think>"
        f"2+3 = 5.{EOS}{USER}Thanks{ASSISTANT}</think>"
    )
    assert DEEPSEEK_V32_CHAT_TEMPLATE.render(CONVERSATION, TOOLS, enable_thinking=False) == expected
    # thinking mode, one user turn (the agent case): the encoder's "<think>" openings, reasoning kept
    messages = [dict(m) for m in CONVERSATION[:5]]
    messages[2]["reasoning_content"] = "r"
    text = DEEPSEEK_V32_CHAT_TEMPLATE.render(messages, add_generation_prompt=False)
    assert text.endswith(
        f"{USER}What is 2+3?{ASSISTANT}<think>r</think>Let me compute.\n\n<{D}function_calls>\n{ADD_CALL}\n"
        f"</{D}function_calls>{EOS}\n\n<function_results>\n<result>5</result>\n</function_results>\n\n"
        f"<think></think>2+3 = 5.{EOS}"
    )


def _random_value(rng: random.Random, depth: int = 0):
    kinds = ["str", "int", "float", "bool", "null"] + (["list", "dict"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "str":  # JSON-looking, multi-line, quoted, non-ASCII, empty
        return rng.choice(
            ["", "42", "true", 'say "hi"', "a\nb\n", "\u00e9t\u00e9 \u6f22\u5b57", "{x}", " pad "]
        )
    if kind == "int":
        return rng.randrange(-(10**12), 10**12)
    if kind == "float":
        return rng.uniform(-1e6, 1e6)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.randrange(4))}


def _random_call(rng: random.Random) -> dict:
    if rng.random() < 0.5:
        return {"function": {"name": "add", "arguments": {"a": rng.randrange(99), "b": -rng.randrange(99)}}}
    arguments = {"path": _random_value(rng) if rng.random() < 0.3 else f"/tmp/{rng.randrange(9)}"}
    if not isinstance(arguments["path"], str):
        arguments["path"] = json.dumps(arguments["path"])
    if rng.random() < 0.8:
        arguments["data"] = _random_value(rng)
    return {"type": "function", "function": {"name": "put", "arguments": arguments}}


def _random_conversation(rng: random.Random, thinking: bool) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": "sys"}] if rng.random() < 0.5 else []
    messages.append({"role": "user", "content": f"q{rng.randrange(100)}"})
    for _ in range(rng.randrange(1, 6)):
        calls = [_random_call(rng) for _ in range(rng.randrange(0, 4))]
        turn: dict = {"role": "assistant", "content": rng.choice(["", "ok", "Let me see.\n"])}
        if calls:
            turn["tool_calls"] = calls
        if thinking and rng.random() < 0.5:
            turn["reasoning_content"] = rng.choice(["hmm", "two\nlines"])
        messages.append(turn)
        if calls:
            messages += [{"role": "tool", "content": f"r{i}"} for i in range(len(calls))]
            if rng.random() < 0.3:
                messages.append({"role": "user", "content": "and then?"})
        else:
            messages.append({"role": "user", "content": "more"})
    return messages


@pytest.mark.parametrize("version", ["v3.2", "v4"])
@pytest.mark.parametrize("thinking", [False, True])
def test_fifty_random_conversations_render_append_only_and_every_call_parses_back(version, thinking):
    template, rng = DsmlChatTemplate(version), random.Random(52)
    for _ in range(50):
        messages = _random_conversation(rng, thinking)
        full = template.render(messages, TOOLS, add_generation_prompt=False, enable_thinking=thinking)
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        text = template.render(messages[:first], TOOLS, enable_thinking=thinking)
        i = first
        while i < len(messages):
            turn = messages[i]
            written = template.render(
                messages[: i + 1], TOOLS, add_generation_prompt=False, enable_thinking=thinking
            )[len(text) :]  # what the model wrote after its prompt, up to and with its EOS
            assert written.endswith(EOS) and ASSISTANT not in written and USER not in written
            parsed = parse_tool_calls(written[: -len(EOS)], TOOLS)
            want = [(c["function"]["name"], c["function"]["arguments"]) for c in turn.get("tool_calls", [])]
            assert [(c.name, c.arguments) for c in parsed.calls] == want and not parsed.errors
            if thinking:
                assert written.startswith((turn.get("reasoning_content") or "") + THINK_CLOSE)
            j = i + 1
            while j < len(messages) and messages[j]["role"] != "assistant":
                j += 1
            text += written + template.render_continuation(messages[i + 1 : j], enable_thinking=thinking)
            i = j
        # the incremental text is the full rendering plus the opening of the next assistant turn
        openings = ("", template.opening("user", thinking), template.opening("tool", thinking))
        assert text.startswith(full) and text[len(full) :] in openings


def _invoke(name: str, *params: str) -> str:
    return f'<{D}invoke name="{name}">\n' + "\n".join(params) + f"\n</{D}invoke>"


def _param(key: str, value: str, string: str = "false") -> str:
    return f'<{D}parameter name="{key}" string="{string}">{value}</{D}parameter>'


def _block(*invokes: str) -> str:
    return f"\n\n<{D}tool_calls>\n" + "\n".join(invokes) + f"\n</{D}tool_calls>"


@pytest.mark.parametrize(
    "text, message",
    [
        (_block(_invoke("add", _param("a", "1")))[:-30], "unterminated invoke"),
        (_block(_invoke("add", _param("a", "1"), _param("b", "{2"))), 'string="false" but its value is not'),
        (_block(_invoke("add", _param("a", "1"), _param("a", "2"))), "duplicate argument 'a'"),
        (_block(f"<{D}invoke>\n</{D}invoke>"), "an invoke needs a name"),
        (_block(_invoke("add", f'<{D}parameter name="a">1</{D}parameter>')), 'string="true|false"'),
        (_block(_invoke("add", f'<{D}parameter name="a" string="false">1')), "unterminated parameter 'a'"),
        (_block(_invoke("add", "a=1", _param("b", "2"))), "unexpected text"),
        (_block(_invoke("mul", _param("a", "1"), _param("b", "2"))), "unknown tool 'mul'"),
        (_block(_invoke("add", _param("a", "1"))), "missing required argument"),
        (_block(_invoke("add", _param("a", "1", "true"), _param("b", "2"))), "'a'"),  # "1" is not an integer
        (_block(_invoke("add", _param("a", "[" * 100000), _param("b", "2"))), "nested too deeply"),
        (f"<{D}tool_calls>\njust text\n</{D}tool_calls>", "without an invoke"),
    ],
)
def test_malformed_dsml_is_an_error_observation_not_an_exception(text, message):
    parsed = parse_tool_calls("thinking about it</think>" + text, TOOLS)
    assert parsed.has_calls and not parsed.calls and len(parsed.errors) == 1
    assert isinstance(parsed.errors[0], ToolCallError) and message in parsed.errors[0].message


def test_a_bad_dsml_call_does_not_hide_the_good_ones():
    text = (
        "Doing both."
        + _block(
            _invoke("add", _param("a", "1"), _param("b", "2")),
            _invoke("add", _param("a", "oops"), _param("b", "2")),
            _invoke("put", _param("path", "/x", "true"), _param("data", '{"k": [1, null]}')),
        )
        + " done"
    )
    parsed = parse_tool_calls(text, TOOLS)
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("add", {"a": 1, "b": 2}),
        ("put", {"path": "/x", "data": {"k": [1, None]}}),
    ]
    assert len(parsed.errors) == 1 and isinstance(parsed.items[1], ToolCallError)
    assert isinstance(parsed.items[2], ToolCall) and parsed.trailing_text == "done"
    # V3.2's block name reads the same; a call inside the reasoning is not a call
    v32 = f"<{D}invoke>?</think>" + text.replace("tool_calls>", "function_calls>")
    assert [c.name for c in parse_tool_calls(v32, TOOLS).calls] == ["add", "put"]


def test_bad_messages_are_refused_in_one_line():
    for bad, match in [
        ([{"role": "user", "content": "q"}, {"role": "system", "content": "s"}], "system message"),
        ([{"role": "assistant", "content": "", "tool_calls": [{"name": "add"}]}], "no 'arguments'"),
        (
            [{"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": "[1]"}]}],
            "object",
        ),
        (
            [{"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": "{"}]}],
            "not JSON",
        ),
    ]:
        with pytest.raises(ValueError, match=match) as err:
            DEEPSEEK_V4_CHAT_TEMPLATE.render(bad)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="DSML version"):
        DsmlChatTemplate("v5")


class _Vocab:
    """A tokenizer stand-in for template selection: only chat_template and token_to_id are used."""

    def __init__(self, tokens: list[str]):
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.chat_template = None  # V3.2 and V4 ship no jinja template

    def token_to_id(self, token: str) -> int | None:
        return self.ids.get(token)


def test_template_for_picks_the_dsml_version_from_the_model_type():
    vocab = _Vocab([BOS, EOS, USER, ASSISTANT])
    assert template_for(vocab, "deepseek_v4") == DEEPSEEK_V4_CHAT_TEMPLATE
    assert template_for(vocab, "deepseek_v32") == DEEPSEEK_V32_CHAT_TEMPLATE
    assert DEEPSEEK_V4_CHAT_TEMPLATE.stop_token_ids(vocab) == [1]
    for model_type in (None, "deepseek_v3"):
        with pytest.raises(ValueError, match="no jinja chat template") as err:
            template_for(vocab, model_type)
        assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def dsml_tokenizer():
    """Qwen3's BPE with DeepSeek's control tokens added as special tokens (atomic, as in V3.2's / V4's), no
    jinja template (as they ship)."""
    import tokenizers

    from rz_agents.model.tokenizer import Tokenizer, qwen3_tokenizer

    backend = tokenizers.Tokenizer.from_str(qwen3_tokenizer().backend.to_str())
    backend.add_special_tokens([BOS, EOS, USER, ASSISTANT, THINK_OPEN, THINK_CLOSE])
    return Tokenizer(backend, eos_token=EOS, bos_token=BOS)


@pytest.mark.parametrize("version", ["v3.2", "v4"])
def test_prompt_sampled_and_continuation_tokens_equal_the_full_conversation(dsml_tokenizer, version):
    tok, template, rng = dsml_tokenizer, DsmlChatTemplate(version), random.Random(3)
    for _ in range(10):
        messages = _random_conversation(rng, thinking=True)
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        ids = template.encode_prompt(tok, messages[:first], TOOLS)
        prefix = template.render(messages[:first], TOOLS)
        i = first
        while i < len(messages):
            full = template.render(messages[: i + 1], TOOLS, add_generation_prompt=False)
            sampled = tok.encode(full[len(prefix) :])  # the model's tokens, ending with EOS
            assert sampled[-1] == template.stop_token_ids(tok)[0]
            j = i + 1
            while j < len(messages) and messages[j]["role"] != "assistant":
                j += 1
            ids += sampled + template.encode_continuation(tok, messages[i + 1 : j])
            prefix = template.render(messages[:j], TOOLS)
            i = j
        assert ids == tok.encode(prefix)


def test_a_v4_checkpoint_tokenizer_gets_the_v4_dsml_format(dsml_tokenizer, tmp_path):
    from rz_agents.model.deepseek_v4_config import DeepseekV4Config
    from rz_agents.runtime.factories import build_tokenizer

    directory = dsml_tokenizer.save(tmp_path / "ckpt")
    (directory / "config.json").write_text(json.dumps(DeepseekV4Config.tiny().to_hf()))
    _, template = build_tokenizer("checkpoint", str(directory))
    assert template == DEEPSEEK_V4_CHAT_TEMPLATE
    (directory / "config.json").write_text(json.dumps({"model_type": "deepseek_v32"}))
    assert build_tokenizer("checkpoint", str(directory))[1] == DEEPSEEK_V32_CHAT_TEMPLATE
