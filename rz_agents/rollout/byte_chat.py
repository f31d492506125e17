"""A byte-level tokenizer and ChatML template for tiny-vocabulary models (tests, CPU demos, benchmarks).

Token ids 0..255 are the UTF-8 bytes; three special tokens follow. The template has the same methods as
``rz_agents.model.chat_template.ChatTemplate`` (``encode_prompt``, ``encode_continuation``,
``stop_token_ids``), so the agent loop runs unchanged on a 320-token random model or on Qwen3.
Rendering is prefix-stable by construction: every message renders to the same bytes wherever it
appears, so render(messages + [obs]) extends render(messages).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

IM_START = 256
IM_END = 257
END_OF_TEXT = 258
VOCAB_SIZE = 259  # the model's vocab may be larger; ids above are decoded as nothing


class ByteTokenizer:
    """UTF-8 bytes as token ids, plus <|im_start|>, <|im_end|>, <|endoftext|>."""

    special = {IM_START: "<|im_start|>", IM_END: "<|im_end|>", END_OF_TEXT: "<|endoftext|>"}
    vocab_size = VOCAB_SIZE
    eos_token_id = IM_END

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (its UTF-8 bytes; special-token strings are not parsed)."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD, ids outside the vocabulary are dropped."""
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                buf.append(i)
                continue
            if buf:
                out.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
            if i in self.special and not skip_special_tokens:
                out.append(self.special[i])
        if buf:
            out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


def _content(m: dict[str, Any]) -> str:
    """A message's text: its content (None is empty) and, for an assistant, each tool call as the
    ``<tool_call>`` block a model writes (envs/tool_calls.py parses it back), so a client that sends the
    conversation back as messages renders the tokens the model sampled."""
    parts = [m.get("content") or ""] if m.get("content") or not m.get("tool_calls") else []
    for call in m.get("tool_calls") or ():
        fn = call.get("function", call)
        arguments = fn.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass  # rendered as the string it is
        parts.append(
            f"<tool_call>\n{json.dumps({'name': fn.get('name'), 'arguments': arguments})}\n</tool_call>"
        )
    return "\n".join(parts)


class ByteChatTemplate:
    """ChatML over byte tokens: <|im_start|>role\\ncontent<|im_end|>\\n ... <|im_start|>assistant\\n."""

    tool_call_format = "json"  # the <tool_call> JSON form (RenderedTemplate.tool_call_format)

    def opens_think(self, enable_thinking: bool = True) -> bool:
        """False: the byte format has no think blocks (RenderedTemplate.opens_think)."""
        return False

    def _message(self, tokenizer: ByteTokenizer, m: dict[str, Any]) -> list[int]:
        text = f"{m['role']}\n{_content(m)}"
        return [IM_START, *tokenizer.encode(text), IM_END, *tokenizer.encode("\n")]

    def _generation_prompt(self, tokenizer: ByteTokenizer) -> list[int]:
        return [IM_START, *tokenizer.encode("assistant\n")]

    def encode_prompt(
        self,
        tokenizer: ByteTokenizer,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict] | None = None,
        enable_thinking: bool = True,
    ) -> list[int]:
        """Tokens of the conversation so far followed by the assistant generation prompt.

        ``enable_thinking`` is accepted for the ChatTemplate interface; the byte format has no think blocks.
        """
        ids: list[int] = []
        if tools:
            ids += self._message(
                tokenizer, {"role": "system", "content": "tools: " + json.dumps(list(tools))}
            )
        for m in messages:
            ids += self._message(tokenizer, m)
        return ids + self._generation_prompt(tokenizer)

    def encode_continuation(
        self,
        tokenizer: ByteTokenizer,
        new_messages: Sequence[dict[str, Any]],
        enable_thinking: bool = True,
    ) -> list[int]:
        """Tokens to append after an assistant turn that ended with <|im_end|>: the newline that closes it,
        the new messages, and the next generation prompt."""
        ids = tokenizer.encode("\n")
        for m in new_messages:
            ids += self._message(tokenizer, m)
        return ids + self._generation_prompt(tokenizer)

    def stop_token_ids(self, tokenizer: ByteTokenizer) -> list[int]:
        """Tokens that end an assistant turn."""
        return [IM_END, END_OF_TEXT]
