"""ChatTemplate: Qwen3 rendering, agreement with the official jinja template, and the token-exact
continuation property the RL rollout relies on (tokens are never re-tokenized)."""

from __future__ import annotations

import json
import random

import pytest

from rz_agents.model.chat_template import (
    CHAT_TEMPLATE_JINJA,
    QWEN3_CHAT_TEMPLATE,
    SMOLLM2_CHAT_TEMPLATE,
    ChatTemplate,
)
from rz_agents.model.tokenizer import Tokenizer, qwen3_tokenizer

# Qwen3's official chat template: the `chat_template` field of Qwen/Qwen3-8B's tokenizer_config.json
# (the template shared by the Qwen3 dense and MoE releases), as quoted verbatim in public repositories
# found with the code search. Used only here, to check our Python rendering against it.
OFFICIAL_QWEN3_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
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
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""  # noqa: E501 (the official template, verbatim)

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
            "description": "Search the web — returns snippets (ünïcödé).",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
            },
        },
    },
]


# ---- random conversations ------------------------------------------------------------------------


def random_text(rng: random.Random, leading_space: bool = True) -> str:
    pieces = [
        "Hello",
        " world",
        "\n",
        "\n\n",
        "  ",
        "x = 1",
        " 42",
        "日本語",
        "ça va",
        "😀",
        "'s",
        "{",
        "}",
        ": ",
        "\t",
    ]
    pieces += ["<think>", "<tool_call>", "<tool_response>", "</tool_response>", "def f():\n    return 3"]
    text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
    return text if leading_space else text.lstrip()


def random_tool_call(rng: random.Random) -> dict:
    arguments = {"code": random_text(rng), "k": rng.randint(0, 9)} if rng.random() < 0.7 else '{"query": "q"}'
    call = {"name": rng.choice(["python", "search"]), "arguments": arguments}
    return {"type": "function", "function": call} if rng.random() < 0.5 else call


def random_assistant(rng: random.Random, with_reasoning: bool) -> dict:
    message: dict = {"role": "assistant", "content": random_text(rng)}
    if with_reasoning:
        message["reasoning_content"] = random_text(rng) or "thinking"
    if rng.random() < 0.4:
        message["tool_calls"] = [random_tool_call(rng) for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.1:
        message["content"] = None
    return message


def random_observation(rng: random.Random) -> list[dict]:
    """What an environment answers after an assistant turn: tool results and/or a user message."""
    kind = rng.random()
    if kind < 0.5:
        return [{"role": "tool", "content": random_text(rng)} for _ in range(rng.randint(1, 3))]
    if kind < 0.8:
        return [{"role": "user", "content": random_text(rng)}]
    if kind < 0.9:
        return [{"role": "tool", "content": random_text(rng)}, {"role": "user", "content": random_text(rng)}]
    return []


def random_conversation(rng: random.Random) -> tuple[list[dict], list[dict] | None]:
    messages: list[dict] = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": random_text(rng)})
    messages.append({"role": "user", "content": random_text(rng)})
    for _ in range(rng.randint(0, 4)):
        messages.append(random_assistant(rng, with_reasoning=rng.random() < 0.5))
        messages.extend(random_observation(rng) or [{"role": "user", "content": "go on"}])
        if rng.random() < 0.1:
            messages.append({"role": "system", "content": random_text(rng)})
    if rng.random() < 0.3:
        messages.append(random_assistant(rng, with_reasoning=rng.random() < 0.5))
    tools = TOOLS if rng.random() < 0.5 else None
    return messages, tools


def official_template_keeps_turns_as_written(messages: list[dict], enable_thinking: bool) -> bool:
    """True when Qwen3's official template renders every assistant turn as ChatTemplate does.

    The official template (1) drops `reasoning_content` of turns before the last user query,
    (2) omits an empty `reasoning_content` on non-final turns, (3) adds an empty think block to a final
    assistant turn without reasoning, (4) re-parses `</think>` out of `content`; and ChatTemplate (5)
    puts the generation prompt's empty think block in front of plain assistant turns when thinking is off.
    """
    last_query = len(messages) - 1
    for i in range(len(messages) - 1, -1, -1):
        content = messages[i].get("content")
        is_wrapped = (
            isinstance(content, str)
            and content.startswith("<tool_response>")
            and content.endswith("</tool_response>")
        )
        if messages[i]["role"] == "user" and isinstance(content, str) and not is_wrapped:
            last_query = i
            break
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        reasoning = message.get("reasoning_content")
        if "</think>" in (message.get("content") or ""):
            return False
        if reasoning is not None and (i <= last_query or not reasoning):
            return False
        if reasoning is None and (i == len(messages) - 1 and i > last_query or not enable_thinking):
            return False
    return True


@pytest.fixture(scope="module")
def qwen3() -> Tokenizer:
    return qwen3_tokenizer()


@pytest.fixture(scope="module")
def hf_qwen3(qwen3, tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    directory = qwen3.save(tmp_path_factory.mktemp("qwen3_tokenizer"))
    return transformers.AutoTokenizer.from_pretrained(str(directory))


def hf_render(hf, template: str, messages, tools, add_generation_prompt: bool, enable_thinking: bool) -> str:
    return hf.apply_chat_template(
        messages,
        tools=tools,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
    )


# ---- rendering ------------------------------------------------------------------------------------


def test_renders_a_plain_chat_in_chatml():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert QWEN3_CHAT_TEMPLATE.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_generation_prompt_has_empty_think_block_when_thinking_is_off():
    text = QWEN3_CHAT_TEMPLATE.render([{"role": "user", "content": "hi"}], enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tools_go_into_the_system_prompt_after_the_system_message():
    text = QWEN3_CHAT_TEMPLATE.render(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}], TOOLS
    )
    assert text.startswith("<|im_start|>system\nS\n\n# Tools\n\nYou may call one or more functions")
    assert "\n<tools>\n" + json.dumps(TOOLS[0], ensure_ascii=False) + "\n" in text
    assert (
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        in text
    )


def test_assistant_tool_calls_and_grouped_tool_results():
    messages = [
        {"role": "user", "content": "compute"},
        {
            "role": "assistant",
            "content": "Let me run it.",
            "tool_calls": [
                {"function": {"name": "python", "arguments": {"code": "print(1)"}}},
                {"name": "search", "arguments": '{"query": "x"}'},
            ],
        },
        {"role": "tool", "content": "1"},
        {"role": "tool", "content": "results"},
    ]
    text = QWEN3_CHAT_TEMPLATE.render(messages)
    assert text.endswith(
        "<|im_start|>assistant\nLet me run it.\n"
        '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\nresults\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_reasoning_content_renders_as_a_think_block():
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "\nA", "reasoning_content": "\nR\n"},
    ]
    assert QWEN3_CHAT_TEMPLATE.render(messages, add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n"
    )


def test_matches_official_qwen3_template_where_it_keeps_turns_as_written(hf_qwen3):
    rng = random.Random(0)
    compared = 0
    for _ in range(600):
        messages, tools = random_conversation(rng)
        enable_thinking = rng.random() < 0.7
        add_generation_prompt = messages[-1]["role"] != "assistant"
        if not official_template_keeps_turns_as_written(messages, enable_thinking):
            continue
        ours = QWEN3_CHAT_TEMPLATE.render(messages, tools, add_generation_prompt, enable_thinking)
        official = hf_render(
            hf_qwen3, OFFICIAL_QWEN3_TEMPLATE, messages, tools, add_generation_prompt, enable_thinking
        )
        assert ours == official, messages
        compared += 1
    assert compared > 150  # the filter must leave a real sample


def test_differs_from_official_only_by_keeping_history_as_generated(hf_qwen3):
    """Documented difference: the official template rewrites earlier assistant turns."""
    history = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
    ]
    official = hf_render(hf_qwen3, OFFICIAL_QWEN3_TEMPLATE, history, None, True, True)
    ours = QWEN3_CHAT_TEMPLATE.render(history)
    assert "r1" not in official  # thinking of turns before the last query is dropped there
    assert "<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>" in ours


def test_exported_jinja_renders_exactly_like_python(hf_qwen3):
    rng = random.Random(1)
    for template in (QWEN3_CHAT_TEMPLATE, SMOLLM2_CHAT_TEMPLATE):
        jinja = template.to_jinja()
        for _ in range(300):
            messages, tools = random_conversation(rng)
            flags = (rng.random() < 0.7, rng.random() < 0.5)
            assert template.render(messages, tools, *flags) == hf_render(
                hf_qwen3, jinja, messages, tools, *flags
            )
    assert CHAT_TEMPLATE_JINJA == QWEN3_CHAT_TEMPLATE.to_jinja()


def test_saved_qwen3_tokenizer_carries_the_same_template(hf_qwen3):
    messages, tools = random_conversation(random.Random(5))
    assert hf_qwen3.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    ) == QWEN3_CHAT_TEMPLATE.render(messages, tools)


def test_rendering_is_append_only():
    """Each prefix of a conversation renders to a prefix of the whole; the generation prompt too."""
    rng = random.Random(3)
    for _ in range(300):
        messages, tools = random_conversation(rng)
        enable_thinking = rng.random() < 0.5
        whole = QWEN3_CHAT_TEMPLATE.render(messages, tools, False, enable_thinking)
        for k in range(1, len(messages)):
            if messages[k - 1]["role"] == messages[k]["role"] == "tool":
                continue  # inside one group of tool results, which closes only after its last result
            head = messages[:k]
            assert whole.startswith(
                QWEN3_CHAT_TEMPLATE.render(head, tools, False, enable_thinking).rstrip("\n")
            )
            # A turn the model wrote after this generation prompt (with thinking off, a turn that
            # carries its own reasoning was not written after the empty think block).
            if messages[k]["role"] == "assistant" and (
                enable_thinking or not messages[k].get("reasoning_content")
            ):
                assert whole.startswith(QWEN3_CHAT_TEMPLATE.render(head, tools, True, enable_thinking))


# ---- the token-exact continuation property ---------------------------------------------------------


def check_rollout_never_retokenizes(
    template: ChatTemplate,
    tokenizer,
    seed: int,
    episodes: int,
    thinking_modes: tuple[bool, ...] = (True, False),
) -> int:
    """Build token sequences the way the rollout does and compare with tokens of the full re-render.

    The sampled text stands in for the policy's tokens; it starts with a non-space character, since
    BPE would join leading whitespace with the "\n" that ends the generation prompt when re-encoding
    the whole text (the rollout never re-encodes, so that case only matters to this comparison).
    """
    rng = random.Random(seed)
    im_end = tokenizer.token_to_id("<|im_end|>")
    turns = 0
    for _ in range(episodes):
        enable_thinking = rng.choice(thinking_modes)
        messages, tools = random_conversation(rng)
        if messages[-1]["role"] == "assistant":
            messages.pop()
        tokens = template.encode_prompt(tokenizer, messages, tools, enable_thinking=enable_thinking)
        assert tokens == tokenizer.encode(template.render(messages, tools, enable_thinking=enable_thinking))
        for _ in range(rng.randint(1, 4)):
            # What the policy samples after the generation prompt (a think block, text, a tool call).
            text = random_text(rng, leading_space=False)
            if enable_thinking and rng.random() < 0.5:
                text = "<think>\n" + random_text(rng) + "\n</think>\n\n" + text
            if rng.random() < 0.5:
                call = '<tool_call>\n{"name": "python", "arguments": {"code": "1+1"}}\n</tool_call>'
                text += "\n" + call if text else call
            tokens += tokenizer.encode(text) + [im_end]
            messages.append({"role": "assistant", "content": text})
            observation = random_observation(rng)
            tokens += template.encode_continuation(tokenizer, observation, enable_thinking=enable_thinking)
            messages.extend(observation)
            full = tokenizer.encode(template.render(messages, tools, enable_thinking=enable_thinking))
            assert tokens == full, messages
            turns += 1
    return turns


def test_prompt_plus_sampled_plus_continuation_equals_tokens_of_the_full_render_qwen3(qwen3):
    assert check_rollout_never_retokenizes(QWEN3_CHAT_TEMPLATE, qwen3, seed=0, episodes=250) > 500


def test_continuation_starts_after_im_end_and_ends_with_the_generation_prompt(qwen3):
    ids = QWEN3_CHAT_TEMPLATE.encode_continuation(qwen3, [{"role": "tool", "content": "4"}])
    assert (
        qwen3.decode(ids)
        == "\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    off = QWEN3_CHAT_TEMPLATE.encode_continuation(qwen3, [], enable_thinking=False)
    assert qwen3.decode(off) == "\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_cut_off_assistant_turn_gets_its_im_end_from_the_continuation(qwen3):
    closed = QWEN3_CHAT_TEMPLATE.encode_continuation(qwen3, [{"role": "user", "content": "more"}])
    open_ = QWEN3_CHAT_TEMPLATE.encode_continuation(
        qwen3, [{"role": "user", "content": "more"}], assistant_closed=False
    )
    assert open_ == [qwen3.token_to_id("<|im_end|>")] + closed


def test_stop_token_ids_are_im_end_then_endoftext(qwen3):
    assert QWEN3_CHAT_TEMPLATE.stop_token_ids(qwen3) == [151645, 151643]


# ---- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "error", "match"),
    [
        ([{"role": "robot", "content": "x"}], ValueError, "role must be one of"),
        ([{"role": "user", "content": ["list"]}], TypeError, "content must be a str"),
        ([{"role": "user", "content": "x"}, "oops"], TypeError, "message 1"),
        ("not a list", TypeError, "list of dicts"),
        (
            [{"role": "assistant", "content": "", "tool_calls": [{"arguments": {}}]}],
            ValueError,
            "function name",
        ),
        ([{"role": "assistant", "content": "", "tool_calls": [{"name": "f"}]}], ValueError, "no 'arguments'"),
        (
            [{"role": "assistant", "content": "", "tool_calls": {"name": "f"}}],
            TypeError,
            "tool_calls must be a list",
        ),
        ([{"role": "assistant", "content": "", "reasoning_content": 3}], TypeError, "reasoning_content"),
    ],
)
def test_bad_messages_get_a_clear_error(messages, error, match):
    with pytest.raises(error, match=match):
        QWEN3_CHAT_TEMPLATE.render(messages)


def test_tools_must_be_a_list():
    with pytest.raises(TypeError, match="tools must be a list"):
        QWEN3_CHAT_TEMPLATE.render([{"role": "user", "content": "x"}], tools={"name": "f"})


def test_tokenizer_without_chatml_markers_is_refused(qwen3):
    class NoChatML:
        def encode(self, text):
            return [0]

        def token_to_id(self, token):
            return None

    with pytest.raises(ValueError, match="ChatML"):
        QWEN3_CHAT_TEMPLATE.stop_token_ids(NoChatML())


# ---- SmolLM2 (same ChatML markers, no tool/think tokens) -------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    from rz_agents.model.gguf import smollm2_tokenizer

    return smollm2_tokenizer()


def test_continuation_property_holds_for_smollm2(smollm2):
    # SmolLM2 has no thinking mode. (Its GPT-2 pre-tokenizer would also split the "\n\n" that ends a
    # non-thinking generation prompt differently once text follows, so re-encoding would not match.)
    turns = check_rollout_never_retokenizes(
        SMOLLM2_CHAT_TEMPLATE, smollm2, seed=1, episodes=100, thinking_modes=(True,)
    )
    assert turns > 200


def test_smollm2_template_matches_the_ggufs_own_template(smollm2, tmp_path):
    transformers = pytest.importorskip("transformers")
    from rz_agents.model.gguf import smollm2_checkpoint_dir

    original = json.loads((smollm2_checkpoint_dir() / "tokenizer_config.json").read_text())[
        "rz_source_chat_template"
    ]
    hf = transformers.AutoTokenizer.from_pretrained(str(smollm2_checkpoint_dir()))
    rng = random.Random(2)
    for _ in range(100):
        messages = [
            {"role": rng.choice(["user", "assistant"]), "content": random_text(rng)} for _ in range(4)
        ]
        if rng.random() < 0.5:
            messages.insert(0, {"role": "system", "content": random_text(rng)})
        assert SMOLLM2_CHAT_TEMPLATE.render(messages) == hf_render(hf, original, messages, None, True, True)
    assert SMOLLM2_CHAT_TEMPLATE.stop_token_ids(smollm2) == [2, 0]
