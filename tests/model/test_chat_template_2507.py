"""Qwen3-2507 chat formats with `tokenizer: checkpoint`: prompts render as the checkpoint's own jinja
template renders them (compared with transformers' apply_chat_template), rollouts stay append-only."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from rz_agents.model.chat_template import ChatTemplate, thinking_style
from rz_agents.model.tokenizer import qwen3_tokenizer
from rz_agents.runtime.factories import build_tokenizer

# The `chat_template` of Qwen/Qwen3-4B-Thinking-2507's tokenizer_config.json (4,049 characters; the
# Thinking-2507 releases share it) and of Qwen/Qwen3-4B-Instruct-2507, as quoted verbatim in public
# repositories found with the code search. Used only here, as the reference our rendering must match.
THINKING_2507 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n<think>\n' }}
{%- endif %}"""  # noqa: E501 (the official template, verbatim)

INSTRUCT_2507 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""  # noqa: E501 (the official template, verbatim)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
]
# The `chat_template` of Qwen/Qwen2.5-7B-Instruct's tokenizer_config.json (the Qwen2.5-Instruct releases share
# it), as quoted verbatim in a public repository's test fixtures found with the code search. Same use as
# above.
QWEN25_INSTRUCT = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""  # noqa: E501 (the official template, verbatim)
# name -> (the checkpoint's jinja, the thinking style it implies); Qwen2.5-Instruct: "never", plus its default
# system prompt (template_for picks QWEN25_CHAT_TEMPLATE).
STYLES = {
    "thinking": (THINKING_2507, "always"),
    "instruct": (INSTRUCT_2507, "never"),
    "qwen25": (QWEN25_INSTRUCT, "never"),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A checkpoint directory per template: the Qwen3 tokenizer with that template in tokenizer_config.json,
    loaded twice: as `tokenizer: checkpoint` loads it, and by transformers."""
    transformers = pytest.importorskip("transformers")
    out = {}
    saved = qwen3_tokenizer().save(tmp_path_factory.mktemp("qwen3"))
    for name, (jinja, _) in STYLES.items():
        directory = Path(shutil.copytree(saved, tmp_path_factory.mktemp(name) / "checkpoint"))
        config = json.loads((directory / "tokenizer_config.json").read_text())
        config["chat_template"] = jinja
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
        (directory / "config.json").write_text('{"model_type": "qwen3"}')  # what marks a checkpoint dir
        ours = build_tokenizer("checkpoint", str(directory))
        out[name] = (*ours, transformers.AutoTokenizer.from_pretrained(str(directory)))
    return out


def official(hf, messages, tools=None, tokenize=False, **kwargs):
    """The checkpoint's own template through transformers (text, or its token ids)."""
    text = hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True, **kwargs)
    return hf.encode(text, add_special_tokens=False) if tokenize else text


def random_prompt(rng: random.Random) -> tuple[list[dict], list[dict] | None]:
    words = ["Compute 2+3.", "日本語", "  spaced  ", "<think>", "a\n\nb", '{"x": 1}', "ça va", ""]
    messages = [{"role": "system", "content": rng.choice(words)}] if rng.random() < 0.5 else []
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(1, 4)))})
    return messages, (TOOLS if rng.random() < 0.5 else None)


def test_tokenizer_checkpoint_takes_the_thinking_style_of_the_checkpoints_template(checkpoints):
    for name, (jinja, style) in STYLES.items():
        assert thinking_style(jinja) == style
        assert checkpoints[name][1].thinking == style
    assert thinking_style(ChatTemplate().to_jinja()) == "switch"
    assert thinking_style(ChatTemplate(thinking="always").to_jinja()) == "always"


@pytest.mark.parametrize("name", list(STYLES))
def test_prompts_render_as_the_checkpoints_own_template(checkpoints, name):
    tokenizer, template, hf = checkpoints[name]
    rng = random.Random(0)
    for _ in range(60):
        messages, tools = random_prompt(rng)
        thinking = rng.random() < 0.5  # neither 2507 template has the switch: it changes nothing
        ours = template.render(messages, tools, enable_thinking=thinking)
        assert ours == official(hf, messages, tools, enable_thinking=thinking), messages
        assert template.encode_prompt(tokenizer, messages, tools) == official(
            hf, messages, tools, tokenize=True
        )
    opening = "<|im_start|>assistant\n" + ("<think>\n" if name == "thinking" else "")
    assert template.render([{"role": "user", "content": "hi"}], enable_thinking=False).endswith(opening)


@pytest.mark.parametrize("name", list(STYLES))
def test_a_rollout_appends_tokens_and_equals_the_official_render_of_the_episode(checkpoints, name):
    """prompt + sampled + <|im_end|> + continuation ... == the checkpoint's template over the whole
    episode."""
    tokenizer, template, hf = checkpoints[name]
    rng = random.Random(1)
    for episode in range(20):
        messages, tools = random_prompt(rng)
        tokens = template.encode_prompt(tokenizer, messages, tools)
        stops = template.stop_token_ids(tokenizer)
        for turn in range(rng.randint(1, 3)):
            arguments = json.dumps({"name": "python", "arguments": {"code": f"print({turn})"}})
            call = f"<tool_call>\n{arguments}\n</tool_call>"
            # what the model writes after the generation prompt (a thinking model: reasoning, </think>,
            # answer)
            written = (f"step {turn} of {episode}\n</think>\n\n" if name == "thinking" else "") + call
            tokens += tokenizer.encode(written) + [stops[0]]
            observation = [{"role": "tool", "content": str(turn)} for _ in range(rng.randint(1, 2))]
            tokens += template.encode_continuation(tokenizer, observation)
            messages += [{"role": "assistant", "content": written}, *observation]
            assert tokens == official(hf, messages, tools, tokenize=True), (name, messages)


def test_thinking_history_of_earlier_queries_stays_as_written(checkpoints):
    """Documented difference: the official template drops the reasoning of turns before the last query."""
    tokenizer, template, hf = checkpoints["thinking"]
    history = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "r1\n</think>\n\na1"},
        {"role": "user", "content": "q2"},
    ]
    assert "r1" not in official(hf, history)
    assert "<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>" in template.render(history)
    assert template.render(history[:2], add_generation_prompt=False) in template.render(history)


@pytest.mark.parametrize("style", ["never", "always"])
def test_exported_jinja_of_each_style_renders_like_python(checkpoints, style):
    hf = checkpoints["thinking"][2]
    template = ChatTemplate(thinking=style)
    rng = random.Random(2)
    for _ in range(40):
        messages, tools = random_prompt(rng)
        messages.append({"role": "assistant", "content": "x\n</think>\n\ny", "reasoning_content": None})
        messages.append({"role": "tool", "content": "4"})
        assert template.render(messages, tools) == official(
            hf, messages, tools, chat_template=template.to_jinja()
        )
