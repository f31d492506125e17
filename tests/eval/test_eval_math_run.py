"""run_math_eval end to end with a scripted policy: real tokenizer, chat template, env, sandbox and scoring.

The engine is the only stand-in: it answers from a script keyed by the question, so the expected
metrics are known exactly. Runs with the real engine and a checkpoint are in test_eval_math_cli.py.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from rz_agents.engine import Completion
from rz_agents.eval.checkpoint_policy import CheckpointPolicy
from rz_agents.eval.math import format_math_table, run_math_eval
from rz_agents.eval.math_config import MathEvalConfig
from rz_agents.model.chat_template import QWEN3_CHAT_TEMPLATE
from rz_agents.model.tokenizer import qwen3_tokenizer


class ScriptedEngine:
    """Answers each request with the next scripted text for the question found in the prompt."""

    def __init__(self, tokenizer, script):
        self.tokenizer = tokenizer
        self.script = script  # question -> list of replies, or a callable(prompt_text) -> reply
        self.calls: dict[str, int] = {}
        self.prompts: list[str] = []
        self.version = 0

    async def generate(self, prompt, params):
        text = self.tokenizer.decode(prompt)
        self.prompts.append(text)
        question = next(q for q in self.script if q in text)
        reply = self.script[question]
        if callable(reply):
            reply = reply(text)
        else:
            n = self.calls.get(question, 0)
            self.calls[question] = n + 1
            reply = reply[n]
        if reply is None:  # the engine fails this request
            return Completion(list(prompt), [], torch.zeros(0), [], "error", error="scripted failure")
        tokens = self.tokenizer.encode(reply)[: params.max_tokens - 1] + [params.stop_token_ids[0]]
        return Completion(list(prompt), tokens, torch.full((len(tokens),), -0.5), [0] * len(tokens), "stop")

    def load_weights(self, state, version):
        raise NotImplementedError


@pytest.fixture(scope="module")
def policy():
    tok = qwen3_tokenizer()
    return CheckpointPolicy(model=None, tokenizer=tok, template=QWEN3_CHAT_TEMPLATE, name="scripted")


def _dataset(tmp_path, rows):
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_direct_answers_are_scored_and_aggregated(tmp_path, policy):
    bench = _dataset(
        tmp_path,
        [
            {"id": "a", "question": "What is 6 times 7?", "answer": "42"},
            {"id": "b", "question": "What is one divided by two?", "answer": "\\frac{1}{2}"},
            {"id": "c", "question": "What is 3 plus 4?", "answer": "7"},
        ],
    )
    engine = ScriptedEngine(
        policy.tokenizer,
        {
            "6 times 7": ["So \\boxed{42}.", "Hmm, \\boxed{41}"],
            "one divided by two": ["\\boxed{0.5}", "It is \\boxed{1/2}"],
            "3 plus 4": ["I do not know.", "\\boxed{3}, no: \\boxed{8}"],
        },
    )
    seen = []
    config = MathEvalConfig(benchmark=bench, k=2, max_tokens=64, save_text=True)
    result = run_math_eval(config, policy, on_sample=lambda i, s: seen.append(i), engine=engine)
    assert result["avg_at_k"] == pytest.approx((1 / 2 + 2 / 2 + 0 / 2) / 3)
    assert result["pass_at_k"] == pytest.approx(2 / 3)
    assert result["no_answer_rate"] == pytest.approx(1 / 6)
    rows = {p["id"]: p for p in result["problems"]}
    assert [rows[x]["num_correct"] for x in "abc"] == [1, 2, 0]
    assert rows["c"]["top_answer"] == "8" and rows["a"]["top_answer"] == "42"
    assert [x["text"] for x in rows["a"]["samples"]] == ["So \\boxed{42}.", "Hmm, \\boxed{41}"]
    assert sorted(seen) == [0, 0, 1, 1, 2, 2]
    # The Qwen3 prompt: the question, the boxed instruction, then the assistant's turn opens.
    prompt = engine.prompts[0]
    assert prompt.startswith("<|im_start|>user\nWhat is 6 times 7?\nPlease reason step by step")
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
    table = format_math_table(result)
    assert re.search(r"^a\s+42\s+1/2\s+42$", table, re.M)
    assert re.search(r"^c\s+7\s+0/2\s+8$", table, re.M)
    assert "avg@2 (pass@1): 50.00%   pass@2: 66.67%" in table


def _tool_then_answer(prompt: str) -> str:
    """Turn 1 calls the tool; turn 2 answers with whatever the sandbox printed."""
    done = re.search(r"<tool_response>\n(.*?)\n</tool_response>", prompt, re.S)
    if done is None:
        return '<tool_call>\n{"name": "python", "arguments": {"code": "print(2 ** 10 + 7)"}}\n</tool_call>'
    return f"The tool printed {done.group(1)}, so the answer is \\boxed{{{done.group(1)}}}."


def test_tool_episodes_run_code_in_the_sandbox_and_a_failing_one_is_recorded(tmp_path, policy):
    bench = _dataset(
        tmp_path,
        [
            {"id": "t", "question": "Compute two to the tenth plus seven.", "answer": "1031"},
            {"id": "f", "question": "This one breaks the engine.", "answer": "1"},
        ],
    )
    engine = ScriptedEngine(
        policy.tokenizer, {"two to the tenth": _tool_then_answer, "breaks the engine": [None]}
    )
    config = MathEvalConfig(benchmark=bench, k=1, tool=True, max_tokens=64, max_turns=3, save_text=True)
    result = run_math_eval(config, policy, engine=engine)
    rows = {p["id"]: p for p in result["problems"]}
    ok = rows["t"]["samples"][0]
    assert ok["correct"] and ok["answer"] == "1031" and ok["tool_turns"] == 1, ok
    assert ok["finish"] == "terminated" and ok["error"] is None
    assert "<tool_response>\n1031\n</tool_response>" in ok["text"] and ok["text"].endswith(
        "\\boxed{1031}.<|im_end|>"
    )
    failed = rows["f"]["samples"][0]
    assert not failed["correct"] and failed["finish"] == "error" and "scripted failure" in failed["error"]
    assert result["num_failed"] == 1 and result["avg_at_k"] == 0.5
    # the tool is offered in the system prompt and the sandbox output came back as a tool response
    assert all('"name": "python"' in p for p in engine.prompts)
    assert sum("<tool_response>\n1031\n</tool_response>" in p for p in engine.prompts) == 1


@pytest.mark.parametrize("tool", [False, True])
def test_no_thinking_puts_an_empty_think_block_in_the_prompt(tmp_path, policy, tool):
    bench = _dataset(tmp_path, [{"id": "q", "question": "What is 1 plus 1?", "answer": "2"}])
    engine = ScriptedEngine(policy.tokenizer, {"1 plus 1": ["\\boxed{2}"]})
    config = MathEvalConfig(benchmark=bench, k=1, tool=tool, thinking=False, max_tokens=16)
    result = run_math_eval(config, policy, engine=engine)
    assert result["avg_at_k"] == 1.0
    assert engine.prompts[0].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_compact_prompt_is_the_question_alone_and_the_tool_still_runs(tmp_path, policy):
    bench = _dataset(
        tmp_path, [{"id": "t", "question": "Compute two to the tenth plus seven.", "answer": "1031"}]
    )
    engine = ScriptedEngine(policy.tokenizer, {"two to the tenth": _tool_then_answer})
    config = MathEvalConfig(
        benchmark=bench, k=1, tool=True, max_tokens=64, max_turns=3, prompt_style="compact"
    )
    result = run_math_eval(config, policy, engine=engine)
    assert result["avg_at_k"] == 1.0 and result["problems"][0]["samples"][0]["tool_turns"] == 1
    first = engine.prompts[0]
    assert first.startswith("<|im_start|>user\nCompute two to the tenth plus seven.<|im_end|>")
    assert all("<tools>" not in p for p in engine.prompts)  # no tool schema in any turn's prompt
    with pytest.raises(Exception, match="prompt_style"):
        MathEvalConfig(benchmark=bench, prompt_style="terse").validate()
