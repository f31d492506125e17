"""Qwen3.5's chat format with `tokenizer: checkpoint`: rendered text and token ids equal the checkpoint's own
jinja (the official Qwen3.5 template, rendered by transformers' jinja) on random agent conversations (system,
tools, thinking on and off, multi-turn tool calls and grouped results); rollouts stay append-only; the XML
tool calls the template writes parse back; malformed ones are error observations."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from rz_agents.envs.tool_calls import ToolCall, ToolCallError, parse_tool_calls
from rz_agents.model.chat_template import ChatTemplate, template_for
from rz_agents.model.qwen3_5_chat import QWEN3_5_CHAT_TEMPLATE, Qwen35ChatTemplate, render_xml_call
from rz_agents.model.tokenizer import qwen3_tokenizer
from rz_agents.runtime.factories import build_tokenizer

# The `chat_template` of the Qwen3.5 checkpoints (Qwen/Qwen3.5-*: chat_template.jinja), as quoted verbatim in
# public repositories found with the code search; see official_templates/README.md. Test data only.
OFFICIAL = (Path(__file__).parent / "official_templates" / "qwen3_5.jinja").read_text()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code and return stdout.",
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
            "description": "Search the web — snippets (ünïcödé).",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "k": {"type": "integer"},
                    "exact": {"type": "boolean"},
                    "filters": {"type": "object"},
                    "sites": {"type": "array"},
                    "weight": {"type": "number"},
                },
            },
        },
    },
]
WORDS = ["Compute 2+3.", "日本語", "  spaced  ", "a\n\nb", '{"x": 1}', "ça va", "x = 1\nprint(x)", "😀", "  "]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(our tokenizer, the template `tokenizer: checkpoint` picks, transformers' tokenizer) of a checkpoint
    directory with the Qwen3 vocabulary and Qwen3.5's jinja."""
    transformers = pytest.importorskip("transformers")
    saved = qwen3_tokenizer().save(tmp_path_factory.mktemp("qwen3"))
    directory = Path(shutil.copytree(saved, tmp_path_factory.mktemp("qwen3_5") / "checkpoint"))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = OFFICIAL
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "config.json").write_text('{"model_type": "qwen3_5"}')
    tokenizer, template = build_tokenizer("checkpoint", str(directory))
    return tokenizer, template, transformers.AutoTokenizer.from_pretrained(str(directory))


def official(hf, messages, tools=None, tokenize=False, enable_thinking=True, generation=True):
    """The checkpoint's own template through transformers (text, or its token ids)."""
    text = hf.apply_chat_template(
        messages,
        tools=tools,
        tokenize=False,
        add_generation_prompt=generation,
        enable_thinking=enable_thinking,
    )
    return hf.encode(text, add_special_tokens=False) if tokenize else text


def random_arguments(rng: random.Random) -> tuple[str, dict]:
    if rng.random() < 0.4:
        return "python", {"code": rng.choice(WORDS) + rng.choice(["", "\n", "\nprint(2)"])}
    keys = rng.sample(["query", "k", "exact", "filters", "sites", "weight"], rng.randint(0, 4))
    values = {
        "query": rng.choice(WORDS),
        "k": rng.randint(-3, 99),
        "exact": rng.random() < 0.5,
        "filters": {"lang": "fr", "n": [1, 2.5, None]},
        "sites": ["a.org", "ünï.de"],
        "weight": rng.choice([0.25, 3.5, -1.75]),
    }
    return "search", {key: values[key] for key in keys}


def random_assistant(rng: random.Random, thinking: bool) -> dict:
    answer = rng.choice(["", "Let me check.", "  Done: 5  ", "日本語\n"])
    message: dict = {"role": "assistant", "content": answer}
    if thinking and rng.random() < 0.5:
        message["reasoning_content"] = rng.choice(["think", "\nstep 1\nstep 2\n", ""])
    elif thinking:  # as the model writes it after the generation prompt's <think>\n
        message["content"] = rng.choice(["r1", "two\nlines"]) + "\n</think>\n\n" + answer.strip()
    if rng.random() < 0.6:
        calls = []
        for _ in range(rng.randint(1, 3)):
            name, arguments = random_arguments(rng)
            call = {"name": name, "arguments": arguments}  # the official template takes no JSON string
            calls.append({"type": "function", "function": call} if rng.random() < 0.5 else call)
        message["tool_calls"] = calls
    return message


def random_agent_episode(rng: random.Random, thinking: bool) -> tuple[list[dict], list[dict] | None]:
    """One task, then assistant turns and tool results: every assistant turn follows the last user query."""
    messages: list[dict] = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": rng.choice(WORDS)})
    messages.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(1, 3)))})
    for _ in range(rng.randint(0, 3)):
        messages.append(random_assistant(rng, thinking))
        results = rng.randint(1, 3)
        messages += [{"role": "tool", "content": rng.choice(WORDS)} for _ in range(results)]
    if rng.random() < 0.5:
        messages.append(random_assistant(rng, thinking))
    return messages, (TOOLS if rng.random() < 0.6 else None)


def test_tokenizer_checkpoint_picks_qwen3_5_from_its_jinja_or_model_type(checkpoint):
    assert isinstance(checkpoint[1], Qwen35ChatTemplate)

    class NoJinja:
        chat_template = None

    assert template_for(NoJinja(), "qwen3_5_moe") is QWEN3_5_CHAT_TEMPLATE
    assert isinstance(template_for(NoJinja(), "qwen3"), ChatTemplate)  # no jinja, not Qwen3.5: Qwen3's
    qwen38 = type("Qwen38", (), {"chat_template": OFFICIAL + "{%- set x = reasoning_effort %}"})()
    with pytest.raises(ValueError, match="reasoning_effort"):
        template_for(qwen38)


@pytest.mark.parametrize("thinking", [True, False])
def test_prompts_render_as_the_official_template_text_and_tokens(checkpoint, thinking):
    tokenizer, template, hf = checkpoint
    rng = random.Random(int(thinking))
    for _ in range(40):
        messages, tools = random_agent_episode(rng, thinking)
        ours = template.render(messages, tools, enable_thinking=thinking)
        assert ours == official(hf, messages, tools, enable_thinking=thinking), messages
        assert template.encode_prompt(tokenizer, messages, tools, enable_thinking=thinking) == official(
            hf, messages, tools, tokenize=True, enable_thinking=thinking
        )


@pytest.mark.parametrize("thinking", [True, False])
def test_a_rollout_appends_tokens_and_equals_the_official_render_of_the_episode(checkpoint, thinking):
    """prompt + sampled + <|im_end|> + continuation ... == the official template over the whole episode."""
    tokenizer, template, hf = checkpoint
    rng = random.Random(7 + int(thinking))
    for episode in range(12):
        messages, tools = random_agent_episode(rng, thinking)
        messages = [m for m in messages if m["role"] in ("system", "user")][:2]
        tokens = template.encode_prompt(tokenizer, messages, tools, enable_thinking=thinking)
        stop = template.stop_token_ids(tokenizer)[0]
        for turn in range(rng.randint(1, 3)):
            name, arguments = random_arguments(rng)
            reasoning = f"step {turn} of {episode}\n</think>\n\n" if thinking else ""
            written = reasoning + "Calling.\n\n" + render_xml_call(name, arguments)
            tokens += tokenizer.encode(written) + [stop]
            observation = [{"role": "tool", "content": str(turn)} for _ in range(rng.randint(1, 2))]
            tokens += template.encode_continuation(tokenizer, observation, enable_thinking=thinking)
            messages += [{"role": "assistant", "content": written}, *observation]
            assert tokens == official(hf, messages, tools, tokenize=True, enable_thinking=thinking), messages
            # the turn as written parses back to the call it makes
            assert parse_tool_calls(written, TOOLS).calls == [ToolCall(name, arguments)]


def test_thinking_of_earlier_queries_stays_as_written(checkpoint):
    """Documented difference: the official template drops the think block of turns before the last query."""
    _, template, hf = checkpoint
    history = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
    ]
    assert "r1" not in official(hf, history)
    assert "<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>" in template.render(history)
    assert template.render(history[:2], add_generation_prompt=False) in template.render(history)


def test_every_rendered_call_parses_back_with_its_types():
    rng = random.Random(3)
    for _ in range(100):
        calls = [random_arguments(rng) for _ in range(rng.randint(1, 3))]
        message = {
            "role": "assistant",
            "content": "ok",
            "tool_calls": [{"name": n, "arguments": a} for n, a in calls],
        }
        text = QWEN3_5_CHAT_TEMPLATE.render([message], add_generation_prompt=False)
        written = text.split("\n</think>\n\n", 1)[1].removesuffix("<|im_end|>\n")
        parsed = parse_tool_calls(written, TOOLS)
        assert not parsed.errors and [(c.name, c.arguments) for c in parsed.calls] == calls


def _call(*parameters: str, name: str = "search") -> str:
    return f"<tool_call>\n<function={name}>\n" + "".join(parameters) + "</function>\n</tool_call>"


def _param(key: str, value: str) -> str:
    return f"<parameter={key}>\n{value}\n</parameter>\n"


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "<tool_call>\n<function=search>\n" + _param("k", "3") + "</tool_call>",
            "unterminated <function=search>",
        ),
        ("<tool_call>\n<function=search>\n" + _param("k", "3"), "unterminated <tool_call>"),
        ("<tool_call>\n<function=search\n</function>\n</tool_call>", "needs <function=NAME>"),
        (_call("<parameter=k>\n3\n"), "unterminated parameter 'k'"),
        (_call(_param("k", "three")), "argument 'k' of 'search' must be of type integer"),
        (_call(_param("exact", "maybe")), "must be true or false"),
        (_call(_param("filters", "{oops")), "must be of type object"),
        (_call(_param("k", "1"), _param("k", "2")), "duplicate argument 'k'"),
        (_call("k=3\n", _param("query", "q")), "unexpected text between the parameters"),
        (_call(_param("query", "q")).replace("</function>", "</function> junk"), "unexpected text after"),
        (_call(_param("code", "1"), name="bash"), "unknown tool 'bash'"),
        (_call(name="python"), "missing required argument"),
        (_call(_param("filters", "[" * 100000)), "nested too deeply"),
    ],
)
def test_malformed_xml_calls_are_error_observations_not_exceptions(text, message):
    parsed = parse_tool_calls("reasoning mentions <tool_call> too\n</think>\n\n" + text, TOOLS)
    assert parsed.has_calls and not parsed.calls and len(parsed.errors) == 1
    assert isinstance(parsed.errors[0], ToolCallError) and message in parsed.errors[0].message


def test_a_bad_xml_call_does_not_hide_the_good_ones_nor_the_json_form():
    good = _call(_param("query", "q"), _param("k", "2"), _param("exact", "True"))
    bad = _call(_param("k", "x"))
    json_call = '<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n</tool_call>'
    parsed = parse_tool_calls(good + "\n" + bad + "\n" + json_call + " done", TOOLS)
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("search", {"query": "q", "k": 2, "exact": True}),
        ("python", {"code": "1"}),
    ]
    assert isinstance(parsed.items[1], ToolCallError) and parsed.trailing_text == "done"


@pytest.mark.parametrize(
    "messages, match",
    [
        ([{"role": "user", "content": "q"}, {"role": "system", "content": "s"}], "system message only"),
        ([{"role": "assistant", "content": "", "tool_calls": [{"name": "python"}]}], "no 'arguments'"),
        ([{"role": "assistant", "content": "", "tool_calls": [{"name": "p", "arguments": "{"}]}], "not JSON"),
        ([{"role": "assistant", "content": "", "tool_calls": [{"name": "p", "arguments": "[1]"}]}], "object"),
        ([{"role": "assistant", "content": "", "tool_calls": "python"}], "must be a list"),
        ([{"role": "user", "content": 3}], "must be a str"),
    ],
)
def test_bad_messages_are_refused_in_one_line(messages, match):
    with pytest.raises((TypeError, ValueError), match=match):
        QWEN3_5_CHAT_TEMPLATE.render(messages)
