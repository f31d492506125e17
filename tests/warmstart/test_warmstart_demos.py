"""Warm-start demonstrations are tokenized exactly as the rollout renders episodes, and SFT learns them."""

import json
import re

import pytest
import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer
from rz_agents.warmstart import (
    WarmStartConfig,
    arithmetic_tool_demos,
    supervised_warm_start,
    word_problem_tool_demos,
)
from rz_agents.warmstart.demos import tool_call_text


def test_demos_render_like_the_agent_loop_and_mask_only_assistant_tokens():
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    demos = arithmetic_tool_demos(tok, tpl, 40, seed=1, difficulty=1, tool_fraction=0.5)
    assert 5 < sum(d.uses_tool for d in demos) < 35
    d = next(d for d in demos if d.uses_tool)
    text = tok.decode(d.tokens)
    question = text.split("user\n")[1].split("<|im_end|>")[0]
    expr = question.removeprefix("Compute ").removesuffix(".")
    prompt = tpl.encode_prompt(tok, [{"role": "user", "content": question}])
    assert d.tokens[: len(prompt)] == prompt and not any(d.loss_mask[: len(prompt)])
    call = tok.encode(tool_call_text(expr)) + [tpl.stop_token_ids(tok)[0]]
    assert d.tokens[len(prompt) : len(prompt) + len(call)] == call
    assert all(d.loss_mask[len(prompt) : len(prompt) + len(call)])
    answer = str(eval(expr))  # noqa: S307 - our own generated digits and operators
    cont = tpl.encode_continuation(tok, [{"role": "tool", "content": answer}])
    start = len(prompt) + len(call)
    assert d.tokens[start : start + len(cont)] == cont and not any(d.loss_mask[start : start + len(cont)])
    assert tok.decode(d.tokens[start + len(cont) :]) == f"\\boxed{{{answer}}}<|im_end|>"


def test_supervised_warm_start_lowers_the_loss():
    torch.manual_seed(0)
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    cfg = ModelConfig.tiny("qwen3", vocab_size=320, hidden_size=64, num_hidden_layers=2)
    model = Transformer(cfg)
    demos = arithmetic_tool_demos(tok, tpl, 96, seed=0, difficulty=1, tool_fraction=1.0)
    result = supervised_warm_start(
        model, demos, WarmStartConfig(demos=96, epochs=2, batch_size=16, warmup_steps=2)
    )
    assert result["steps"] == 12
    assert result["loss_end"] < 0.75 * result["loss_start"]  # from ln(320) = 5.77


def test_micro_batches_accumulate_to_the_same_update_as_the_whole_batch():
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    demos = arithmetic_tool_demos(tok, tpl, 16, seed=1, difficulty=1, tool_fraction=1.0)
    cfg = ModelConfig.tiny("qwen3", vocab_size=320, hidden_size=64, num_hidden_layers=2)
    weights, losses = [], []
    for budget in (None, 300):  # 300 tokens: about 3 demonstrations per packed forward
        model = Transformer(cfg)
        model.reset_parameters(seed=0)
        ws = WarmStartConfig(demos=16, epochs=1, batch_size=16, warmup_steps=0, micro_batch_tokens=budget)
        losses.append(supervised_warm_start(model, demos, ws)["loss_start"])
        weights.append({k: v.clone() for k, v in model.state_dict().items()})
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    for k, v in weights[0].items():
        torch.testing.assert_close(v, weights[1][k], rtol=1e-5, atol=1e-6)


def test_word_problem_demos_call_the_tool_with_the_story_translated_into_code():
    tok, tpl = ByteTokenizer(), ByteChatTemplate()
    demos = word_problem_tool_demos(tok, tpl, 12, seed=5, difficulty=1)
    assert all(d.uses_tool for d in demos)
    for d in demos:
        text = tok.decode(d.tokens)
        question = text.split("user\n")[1].split("<|im_end|>")[0]
        code = json.loads(text.split("<tool_call>")[1].split("</tool_call>")[0])["arguments"]["code"]
        assert not question.startswith("Compute") and question.endswith("?")
        assert all(n in question for n in re.findall(r"\d+", code)), (code, question)
        answer = str(eval(code))  # noqa: S307 - our own generated digits and operators
        assert text.endswith(f"\\boxed{{{answer}}}<|im_end|>"), text
        # the tool's output (the answer) is an observation, not a trained token
        prompt = tpl.encode_prompt(tok, [{"role": "user", "content": question}])
        assert not any(d.loss_mask[: len(prompt)]) and all(d.loss_mask[len(prompt) : len(prompt) + 5])
