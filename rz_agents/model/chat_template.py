"""The Qwen3 chat format (ChatML + tools + thinking), written in Python, with a token-exact incremental API.

Rendering follows Qwen3's official jinja template for everything the model sees: the tools block in the
system prompt, ``<tool_call>`` JSON for assistant tool calls, consecutive tool results grouped into one
user turn of ``<tool_response>`` blocks, ``<think>`` blocks, and the generation prompt (with the empty
think block when thinking is disabled).

One deliberate difference makes rendering append-only, which RL rollouts need (tokens are never
re-tokenized): an assistant turn renders the same wherever it sits in the conversation.

- The official template drops the thinking of assistant turns before the last user query and
  re-parses ``<think>`` out of `content`; here `content` is rendered verbatim (it is what the model
  wrote), and `reasoning_content`, when given, is always rendered as a think block.
- With ``enable_thinking=False`` the generation prompt ends in an empty think block, so an assistant
  turn without `reasoning_content` is rendered with that empty block in front of its content: the
  history shows what the model actually saw when it wrote the turn.

Hence ``render(messages + [assistant, *obs])`` extends ``render(messages)`` by exactly the assistant's
text, ``<|im_end|>``, and the continuation that `ChatTemplate.encode_continuation` returns.

Three thinking styles cover the Qwen3 releases (``ChatTemplate.thinking``):

- ``"switch"``: the hybrid Qwen3 models (``enable_thinking``, as above);
- ``"never"``: Qwen3-*-Instruct-2507, which do not think: the generation prompt is the bare assistant
  header whatever ``enable_thinking`` says, and an assistant turn is its content (``reasoning_content`` is
  not rendered, as in the official template);
- ``"always"``: Qwen3-*-Thinking-2507, whose generation prompt always opens ``<think>\n``: the model writes
  its reasoning, ``</think>`` and its answer after it, so an assistant turn renders as ``<think>\n`` + what
  it wrote (or ``<think>\n{reasoning}\n</think>\n\n{content}`` from ``reasoning_content``). The
  official template renders the same for the turns of the current query and drops the thinking of
  earlier queries; here history stays as written (append-only), as for the hybrid models.

`template_for` picks the style from a checkpoint's own jinja ``chat_template``.

The same template works for SmolLM2-Instruct (ChatML markers; it has no tool/think tokens, so those
tags are tokenized as plain text). `CHAT_TEMPLATE_JINJA` is a jinja rendering of these same rules,
written to tokenizer_config.json so other tools (transformers, vLLM) render identically.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rz_agents.deepseek_tokens import ASSISTANT, THINK_CLOSE
from rz_agents.model.chat_messages import (
    Message,
    RenderedTemplate,
    TextEncoder,
    call_function,
    check_tools,
    required_id,
    stop_ids,
    tool_calls_of,
)
from rz_agents.model.chat_messages import check_messages as _check_messages
from rz_agents.model.chat_messages import message_content as _content
from rz_agents.model.deepseek_chat import DEEPSEEK_V31_CHAT_TEMPLATE, DeepSeekChatTemplate
from rz_agents.model.deepseek_dsml import DSML_MODEL_TYPES, DsmlChatTemplate
from rz_agents.model.kimi_chat import KIMI_CHAT_TEMPLATE, KIMI_MODEL_TYPES, KimiChatTemplate
from rz_agents.model.qwen3_5_chat import QWEN3_5_CHAT_TEMPLATE, QWEN3_5_MODEL_TYPES, Qwen35ChatTemplate

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
EMPTY_THINK = "<think>\n\n</think>\n\n"

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)

SMOLLM2_DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# Qwen2.5-Instruct (and -Math-Instruct, -Coder-Instruct): ChatML without think blocks, this default system
# prompt when the conversation has none (with or without tools); its tool format is Qwen3's.
QWEN25_DEFAULT_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
# DeepSeek's own chat format: not ChatML. V3.1's (its assistant header closes an empty think block) is
# rendered by rz_agents.model.deepseek_chat; R1-Distill-Qwen's and the original V3's are refused.
DEEPSEEK_ASSISTANT_MARKER = ASSISTANT
DEEPSEEK_V31_MARKER = ASSISTANT + THINK_CLOSE
THINKING_STYLES = ("switch", "never", "always")
OPEN_THINK = "<think>\n"


def _tojson(value: Any) -> str:
    # Same output as the `tojson` filter transformers installs for chat templates.
    return json.dumps(value, ensure_ascii=False)


def _render_tool_call(call: Any, index: int) -> str:
    name, arguments = call_function(call, index)  # the OpenAI shape or the bare {"name", "arguments"}
    arguments_text = arguments if isinstance(arguments, str) else _tojson(arguments)
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments_text}}}\n</tool_call>'


@dataclass(frozen=True)
class ChatTemplate(RenderedTemplate):
    """Qwen3-style ChatML rendering.

    Args:
        default_system_prompt: system prompt used when the conversation does not start with a system
            message (None for Qwen3; SmolLM2-Instruct's own template uses `SMOLLM2_DEFAULT_SYSTEM_PROMPT`).
        thinking: "switch" (hybrid Qwen3: `enable_thinking`), "never" (Qwen3-Instruct-2507) or "always"
            (Qwen3-Thinking-2507); see the module docstring.
    """

    default_system_prompt: str | None = None
    thinking: str = "switch"

    def __post_init__(self) -> None:
        if self.thinking not in THINKING_STYLES:
            raise ValueError(f"thinking must be one of {THINKING_STYLES}, got {self.thinking!r}")

    # ---- text ---------------------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
    ) -> str:
        """The conversation as prompt text.

        Messages are dicts with `role` (system/user/assistant/tool) and `content` (str or None);
        assistant messages may carry `reasoning_content` (str) and `tool_calls` (list of
        ``{"function": {"name", "arguments"}}`` or ``{"name", "arguments"}``; arguments a dict or a
        JSON string). `tools` are JSON-schema function descriptions, rendered into the system prompt.
        """
        _check_messages(messages)
        parts = [self._system_header(messages, tools)]
        start = 1 if messages and messages[0]["role"] == "system" else 0
        parts.append(self._render_turns(messages, start, enable_thinking))
        if add_generation_prompt:
            parts.append(self.generation_prompt(enable_thinking))
        return "".join(parts)

    def generation_prompt(self, enable_thinking: bool = True) -> str:
        """The text that opens the assistant's turn: with an empty think block when a hybrid model's thinking
        is off, with an open ``<think>`` for a thinking-only model."""
        if self.thinking == "always":
            return f"{IM_START}assistant\n{OPEN_THINK}"
        off = self.thinking == "switch" and not enable_thinking
        return f"{IM_START}assistant\n" + (EMPTY_THINK if off else "")

    def render_continuation(self, new_messages: Sequence[Message], enable_thinking: bool = True) -> str:
        """Text that follows an assistant turn's closing ``<|im_end|>``: the new turns + generation prompt.

        `new_messages` are the observation turns (tool results, user messages) that come after the
        assistant turn; an empty list gives the assistant the next turn directly.
        """
        _check_messages(new_messages)
        # The assistant turn's own rendering ends "<|im_end|>\n"; the sampled tokens stop at <|im_end|>.
        return (
            "\n"
            + self._render_turns(new_messages, 0, enable_thinking)
            + self.generation_prompt(enable_thinking)
        )

    def _system_header(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None) -> str:
        if messages and messages[0]["role"] == "system":
            system: str | None = _content(messages[0], 0)
        else:
            system = self.default_system_prompt
        if tools:
            check_tools(tools)
            body = "" if system is None else system + "\n\n"
            body += TOOLS_HEADER + "".join("\n" + _tojson(tool) for tool in tools) + TOOLS_FOOTER
            return f"{IM_START}system\n{body}{IM_END}\n"
        if system is not None:
            return f"{IM_START}system\n{system}{IM_END}\n"
        return ""

    def _render_turns(self, messages: Sequence[Message], start: int, enable_thinking: bool) -> str:
        """Render messages[start:]; a tool group's boundaries look at the neighbours inside `messages`."""
        parts: list[str] = []
        for i in range(start, len(messages)):
            message = messages[i]
            role = message["role"]
            content = _content(message, i)
            if role in ("user", "system"):
                parts.append(f"{IM_START}{role}\n{content}{IM_END}\n")
            elif role == "assistant":
                parts.append(self._render_assistant(message, i, content, enable_thinking))
            else:  # tool: consecutive results share one user turn
                if i == 0 or messages[i - 1]["role"] != "tool":
                    parts.append(f"{IM_START}user")
                parts.append(f"\n<tool_response>\n{content}\n</tool_response>")
                if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
                    parts.append(f"{IM_END}\n")
        return "".join(parts)

    def _render_assistant(self, message: Message, index: int, content: str, enable_thinking: bool) -> str:
        reasoning = message.get("reasoning_content")
        if self.thinking == "never":
            body = content  # the model does not think; the official template ignores reasoning_content
        elif isinstance(reasoning, str):
            body = OPEN_THINK + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n")
        elif self.thinking == "always":
            body = OPEN_THINK + content  # what the model wrote after the generation prompt's <think>
        elif not enable_thinking:
            body = EMPTY_THINK + content
        else:
            body = content
        tool_calls = tool_calls_of(message, index)
        for k, call in enumerate(tool_calls):
            if k > 0 or content:
                body += "\n"
            body += _render_tool_call(call, index)
        return f"{IM_START}assistant\n{body}{IM_END}\n"

    # ---- tokens -------------------------------------------------------------------------------

    def turn_end_id(self, tokenizer: TextEncoder) -> int:
        """``<|im_end|>``: put in front of a continuation after a cut-off turn (``encode_continuation``,
        RenderedTemplate). Because it is an atomic token, prompt + sampled + continuation equals the tokens
        of the full re-rendered conversation (tested over random conversations): nothing is re-tokenized. A
        turn that stopped on ``<|endoftext|>`` (end of document) has no ChatML continuation: end the episode
        there."""
        return required_id(tokenizer, IM_END)

    def stop_token_ids(self, tokenizer: TextEncoder) -> list[int]:
        """Ids that end an assistant turn: ``<|im_end|>``, then ``<|endoftext|>`` if the vocabulary has it."""
        return stop_ids(tokenizer, IM_END, [END_OF_TEXT], "ChatML")

    # ---- jinja for other tools ----------------------------------------------------------------

    def to_jinja(self) -> str:
        """A jinja template that renders exactly like `render` (for tokenizer_config.json)."""
        if self.default_system_prompt is None:
            default = "{%- set system_text = none %}"
        else:
            default = (
                "{%- set system_text = " + json.dumps(self.default_system_prompt, ensure_ascii=False) + " %}"
            )
        # the thinking style as a jinja variable: "switch" follows enable_thinking
        style = "{%- set style = " + json.dumps(self.thinking) + " %}\n"
        return style + _JINJA.replace("@DEFAULT_SYSTEM@", default)


# The rules of ChatTemplate.render as jinja (transformers' sandbox: `tojson` and str methods available).
_JINJA = (
    "{%- set thinking = not (enable_thinking is defined and enable_thinking is false) %}\n"
    "{%- if messages and messages[0].role == 'system' %}\n"
    "    {%- set system_text = messages[0].content if messages[0].content is string else '' %}\n"
    "{%- else %}\n"
    "    @DEFAULT_SYSTEM@\n"
    "{%- endif %}\n"
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if system_text is not none %}{{- system_text + '\\n\\n' }}{%- endif %}\n"
    "    {{- " + json.dumps(TOOLS_HEADER) + " }}\n"
    "    {%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}\n"
    "    {{- " + json.dumps(TOOLS_FOOTER + "<|im_end|>\n") + " }}\n"
    "{%- elif system_text is not none %}\n"
    "    {{- '<|im_start|>system\\n' + system_text + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- set content = message.content if message.content is string else '' %}\n"
    "    {%- if message.role == 'system' and loop.first %}\n"
    "    {%- elif message.role == 'user' or message.role == 'system' %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'assistant' %}\n"
    "        {{- '<|im_start|>assistant\\n' }}\n"
    "        {%- if style == 'never' %}\n"
    "            {{- content }}\n"
    "        {%- elif message.reasoning_content is string %}\n"
    "            {{- '<think>\\n' + message.reasoning_content.strip('\\n') + '\\n</think>\\n\\n'"
    " + content.lstrip('\\n') }}\n"
    "        {%- elif style == 'always' %}\n"
    "            {{- '<think>\\n' + content }}\n"
    "        {%- elif not thinking %}\n"
    "            {{- '<think>\\n\\n</think>\\n\\n' + content }}\n"
    "        {%- else %}\n"
    "            {{- content }}\n"
    "        {%- endif %}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}\n"
    "                {%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}\n"
    '                {{- \'<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}\n'
    "                {%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'tool' %}\n"
    "        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}\n"
    "        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if style == 'always' %}{{- '<think>\\n' }}\n"
    "    {%- elif style == 'switch' and not thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}\n"
    "{%- endif %}\n"
)

QWEN3_CHAT_TEMPLATE = ChatTemplate()
QWEN3_INSTRUCT_2507_CHAT_TEMPLATE = ChatTemplate(thinking="never")
QWEN3_THINKING_2507_CHAT_TEMPLATE = ChatTemplate(thinking="always")
SMOLLM2_CHAT_TEMPLATE = ChatTemplate(default_system_prompt=SMOLLM2_DEFAULT_SYSTEM_PROMPT)
QWEN25_CHAT_TEMPLATE = ChatTemplate(default_system_prompt=QWEN25_DEFAULT_SYSTEM_PROMPT, thinking="never")
CHAT_TEMPLATE_JINJA = QWEN3_CHAT_TEMPLATE.to_jinja()


def thinking_style(jinja: str) -> str:
    """The thinking style of a checkpoint's jinja chat template (see `ChatTemplate.thinking`).

    A template with an ``enable_thinking`` switch is hybrid; one whose generation prompt opens a think
    block unconditionally is thinking-only (Qwen3-Thinking-2507); one without think blocks at all is
    non-thinking (Qwen3-Instruct-2507). Anything else is taken as hybrid.
    """
    ours = re.search(r'set style = "(\w+)"', jinja)  # written by ChatTemplate.to_jinja
    if ours and ours.group(1) in THINKING_STYLES:
        return ours.group(1)
    if "enable_thinking" in jinja:
        return "switch"
    if "assistant\\n<think>\\n'" in jinja or "assistant\n<think>\n'" in jinja:
        return "always"
    if "<think>" not in jinja and "<|im_start|>" in jinja:
        return "never"
    return "switch"


AnyTemplate = ChatTemplate | DeepSeekChatTemplate | DsmlChatTemplate | Qwen35ChatTemplate | KimiChatTemplate
KIMI_MARKER = "<|im_middle|>"  # Kimi's role separator: in its jinja and its vocabulary
QWEN3_5_MARKER = "<function="  # the Qwen3-Coder XML tool-call form Qwen3.5's jinja writes


def _family_template(tokenizer: Any, jinja: str, model_type: str | None) -> AnyTemplate | None:
    """Kimi's or Qwen3.5's format when the jinja (or, with no jinja, the model_type) says so; else None."""
    token_to_id = getattr(tokenizer, "token_to_id", None)
    if KIMI_MARKER in jinja or (
        not jinja and model_type in KIMI_MODEL_TYPES and token_to_id and token_to_id(KIMI_MARKER) is not None
    ):
        return KIMI_CHAT_TEMPLATE
    if QWEN3_5_MARKER in jinja and "<think>" in jinja or (not jinja and model_type in QWEN3_5_MODEL_TYPES):
        if "reasoning_effort" in jinja:
            raise ValueError(
                "the tokenizer's chat template has a reasoning_effort setting (Qwen3.8's), whose system "
                "prompt the Qwen3.5 format here does not render: not supported; use raw prompts"
            )
        return QWEN3_5_CHAT_TEMPLATE
    return None


def template_for(tokenizer: Any, model_type: str | None = None) -> AnyTemplate:
    """The chat template that renders like the tokenizer's own jinja ``chat_template``: Kimi's
    (`rz_agents.model.kimi_chat`) or Qwen3.5's (XML tool calls; `rz_agents.model.qwen3_5_chat`) when the
    jinja writes their markers, or has no jinja and the checkpoint's `model_type` names them; SmolLM2's or
    Qwen2.5's (their default system prompts) when the jinja names them; DeepSeek-V3.1's (its ``thinking``
    switch and tool-call tokens; `rz_agents.model.deepseek_chat`); else Qwen3's, in the jinja's thinking
    style. A DeepSeek tokenizer with no jinja gets DeepSeek-V3.2's or V4's DSML format
    (`rz_agents.model.deepseek_dsml`) when the checkpoint's `model_type` (config.json) says which. Other
    DeepSeek formats (R1-Distill's; a jinja-less one of an unknown model type) are refused in one line."""
    jinja = tokenizer.chat_template or ""
    family = _family_template(tokenizer, jinja, model_type)
    if family is not None:
        return family
    if SMOLLM2_DEFAULT_SYSTEM_PROMPT in jinja:
        return SMOLLM2_CHAT_TEMPLATE
    if QWEN25_DEFAULT_SYSTEM_PROMPT in jinja:
        return QWEN25_CHAT_TEMPLATE
    if DEEPSEEK_ASSISTANT_MARKER in jinja:
        if DEEPSEEK_V31_MARKER in jinja:
            return DEEPSEEK_V31_CHAT_TEMPLATE
        raise ValueError(
            "the tokenizer's chat template is DeepSeek's but not V3.1's (<\uff5cAssistant\uff5c></think>, "
            "e.g. DeepSeek-R1-Distill-Qwen's): not supported; use raw prompts or a ChatML tokenizer"
        )
    token_to_id = getattr(tokenizer, "token_to_id", None)
    if not jinja and token_to_id is not None and token_to_id(DEEPSEEK_ASSISTANT_MARKER) is not None:
        if model_type in DSML_MODEL_TYPES:
            return DsmlChatTemplate(DSML_MODEL_TYPES[model_type])
        raise ValueError(
            "the tokenizer is DeepSeek's with no jinja chat template and the checkpoint's model_type "
            f"{model_type!r} is none of {sorted(DSML_MODEL_TYPES)} (whose DSML format is rendered here): "
            "add a chat_template to tokenizer_config.json or use raw prompts"
        )
    return {
        "switch": QWEN3_CHAT_TEMPLATE,
        "never": QWEN3_INSTRUCT_2507_CHAT_TEMPLATE,
        "always": QWEN3_THINKING_2507_CHAT_TEMPLATE,
    }[thinking_style(jinja)]


def checkpoint_template(tokenizer: Any, directory: str | Path) -> AnyTemplate:
    """`template_for` the tokenizer of checkpoint `directory`, told the model_type of its config.json (which
    picks DeepSeek-V3.2's or V4's format, Qwen3.5's or Kimi's, for jinja-less tokenizers)."""
    config = Path(directory) / "config.json"
    model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    return template_for(tokenizer, model_type)
