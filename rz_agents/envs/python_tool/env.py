"""``PythonToolEnv``: a math task solved with a sandboxed Python tool (``rz_agents/PythonTool-v0``).

Each turn of the policy either calls the ``python`` tool (Qwen3/Hermes ``<tool_call>`` blocks,
or fenced python code when ``code_blocks=True``) and gets the results back as ``tool`` messages,
or gives its final answer in ``\\boxed{}``, which ends the episode with reward 1 if correct, 0
if not (``-format_penalty`` when no boxed answer is given at all). ``trailing_text_penalty`` is
subtracted for each calling turn that goes on after its last complete call.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np

from rz_agents.data.synthetic import arithmetic_task
from rz_agents.envs.base import Message, MultiTurnTextEnv, ToolSpec
from rz_agents.envs.python_tool.limits import SandboxLimits
from rz_agents.envs.python_tool.pool import SandboxPool
from rz_agents.envs.python_tool.sandbox import PythonSandbox, SandboxError, SandboxResult
from rz_agents.envs.tool_calls import ToolCall, parse_tool_calls
from rz_agents.rewards import MathVerifier, extract_boxed, math_reward

PYTHON_TOOL: ToolSpec = {
    "type": "function",
    "function": {
        "name": "python",
        "description": (
            "Run Python code in a persistent session (variables and imports are kept between calls). "
            "Returns what the code prints and the value of its last expression."
        ),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        },
    },
}

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful problem solver. You can run Python with the `python` tool to compute exact "
    "results. When you are done, give the final answer in \\boxed{}."
)
ANSWER_INSTRUCTION = "Put your final answer in \\boxed{}."


def format_tool_result(result: SandboxResult, max_chars: int = 4000) -> str:
    """The text the policy sees for one call: output, then stderr and the error, if any."""
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if result.error and result.error not in result.stderr:
        parts.append(f"Error: {result.error}")
    text = "\n".join(parts) if parts else "(no output)"
    if len(text) > max_chars:
        half = max_chars // 2
        text = text[:half] + f"\n... [{len(text) - 2 * half} characters cut] ...\n" + text[-half:]
    return text


def _infra_failure(result: SandboxResult, timeouts_are_infra: bool) -> str | None:
    """Why ``result`` is the infrastructure's failure rather than the policy's, or None when it is not."""
    if result.lost:
        return f"sandbox lost: {result.error}"
    if timeouts_are_infra and result.timed_out:
        return f"sandbox timeout (timeouts_are_infra): {result.error}"
    return None


class PythonToolEnv(MultiTurnTextEnv):
    """Solve a math/arithmetic task with a sandboxed Python tool.

    Tasks are ``{"id", "question", "answer"}`` dicts: passed per episode as
    ``reset(options={"task": ...})``, or drawn (with the reset seed) from ``tasks`` (a list or a
    ``rz_agents.data.load_dataset`` name), or generated arithmetic of ``difficulty`` when neither.

    ``prompt_style="compact"`` gives just the question as the user message (no system prompt,
    no instructions) for tiny policies. ``advertise_tools=False`` leaves the tool spec out of
    ``info["tools"]`` (so out of the rendered prompt): for policies that know their tool from training.
    Subclasses change the generated tasks by setting ``generate_task`` (``(rng, difficulty, index=,
    seed=) -> task``).
    ``trailing_text_penalty``: reward subtracted for a turn whose text goes on after its last
    complete ``</tool_call>`` (e.g. the call padded with repeated closing tags); the Hermes format
    ends a calling turn at its call, and a penalty (rather than cutting the turn there) keeps every
    sampled token in the trajectory and teaches the policy to stop by itself, whatever engine
    samples it later.
    Infrastructure failures (docs/training_loop.md): a call that finds its sandbox already dead (killed
    between calls: host OOM killer, preemption) ends the turn with ``info["infra_failure"]`` set, and the
    rollout masks the episode out of its group instead of scoring it. ``timeouts_are_infra``: a call
    that exceeds its wall time is reported the same way (default False: a timeout is the policy's code
    running too long, an error the policy sees and is scored on).
    ``prewarm``: start the episode's sandbox at reset (it boots while the first turn is
    generated); False starts it at the first tool call, saving the start-up CPU for episodes
    that never call the tool.
    """

    generate_task = staticmethod(arithmetic_task)

    def __init__(
        self,
        max_turns: int = 4,
        tasks: list[dict[str, Any]] | str | None = None,
        difficulty: int = 2,
        limits: SandboxLimits | None = None,
        sandbox_pool: SandboxPool | None = None,
        code_blocks: bool = False,
        prompt_style: str = "default",
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        format_penalty: float = 0.0,
        trailing_text_penalty: float = 0.0,
        max_calls_per_turn: int = 4,
        verifier: MathVerifier | None = None,
        backend: str = "local",
        allow_unsandboxed: bool = False,
        prewarm: bool = True,
        advertise_tools: bool = True,
        timeouts_are_infra: bool = False,
    ) -> None:
        super().__init__(max_turns=max_turns)
        if prompt_style not in ("default", "compact"):
            raise ValueError(f"prompt_style must be 'default' or 'compact', got {prompt_style!r}")
        if isinstance(tasks, str):
            from rz_agents.data import load_dataset

            tasks = load_dataset(tasks)
        if tasks is not None and not tasks:
            raise ValueError("tasks is empty")
        self.tasks = tasks
        self.difficulty = difficulty
        self.limits = limits or SandboxLimits()
        self.sandbox_pool = sandbox_pool
        self.code_blocks = code_blocks
        self.prompt_style = prompt_style
        self.system_prompt = system_prompt
        self.format_penalty = format_penalty
        self.trailing_text_penalty = trailing_text_penalty
        self.max_calls_per_turn = max_calls_per_turn
        self.verifier = verifier
        self.backend = backend
        self.allow_unsandboxed = allow_unsandboxed
        self.prewarm = prewarm
        self.advertise_tools = advertise_tools
        self.timeouts_are_infra = timeouts_are_infra
        self.tools = [PYTHON_TOOL]
        self.task: dict[str, Any] = {}
        self.sandbox: PythonSandbox | None = None

    # --- episode ------------------------------------------------------------------------------
    def _draw_task(self, rng: np.random.Generator) -> dict[str, Any]:
        if self.tasks is not None:
            return dict(self.tasks[int(rng.integers(len(self.tasks)))])
        seed = int(rng.integers(2**31))
        return type(self).generate_task(random.Random(seed), self.difficulty, index=0, seed=seed)

    def _reset(self, task: dict[str, Any] | None, rng: np.random.Generator) -> tuple[list[Message], dict]:
        task = dict(task) if task is not None else self._draw_task(rng)
        for key in ("question", "answer"):
            if key not in task:
                raise ValueError(f"task must have a {key!r} field, got keys {sorted(task)}")
        self.task = task
        self._release_sandbox()
        if self.prewarm:
            # start the interpreter now: it boots while the policy writes its first turn
            self.sandbox = self._new_sandbox()
        if self.prompt_style == "compact":
            messages = [{"role": "user", "content": str(task["question"])}]
        else:
            messages = [{"role": "user", "content": f"{task['question']}\n\n{ANSWER_INSTRUCTION}"}]
            if self.system_prompt:
                messages.insert(0, {"role": "system", "content": self.system_prompt})
        # a stable id when the task has none (hash() is salted per process)
        digest = hashlib.sha1(str(task["question"]).encode()).hexdigest()[:12]
        task_id = str(task.get("id", f"task-{digest}"))
        tools = list(self.tools) if self.advertise_tools else []
        return messages, {"task_id": task_id, "tools": tools, "answer": str(task["answer"])}

    def _new_sandbox(self) -> PythonSandbox:
        if self.sandbox_pool is not None:
            return self.sandbox_pool.acquire()
        return PythonSandbox(self.limits, backend=self.backend, allow_unsandboxed=self.allow_unsandboxed)

    def _release_sandbox(self) -> None:
        if self.sandbox is not None:
            if self.sandbox_pool is not None:
                self.sandbox_pool.release(self.sandbox)
            else:
                self.sandbox.close()
            self.sandbox = None

    def _run_code(self, code: str) -> SandboxResult:
        if self.sandbox is None:
            self.sandbox = self._new_sandbox()
        try:
            return self.sandbox.run(code)
        except Exception as exc:  # noqa: BLE001 - a broken sandbox fails this call, not the episode
            self._release_sandbox()
            # a sandbox that cannot start is the infrastructure's failure, not the policy's
            return SandboxResult(error=f"SandboxError: {exc}", lost=isinstance(exc, SandboxError))

    def _step(self, text: str) -> tuple[list[Message], float, bool, dict]:
        turn = parse_tool_calls(text, self.tools, code_blocks=self.code_blocks)
        if turn.has_calls:
            messages: list[Message] = []
            ran = errors = 0
            for item in turn.items[: self.max_calls_per_turn]:
                if isinstance(item, ToolCall):
                    result = self._run_code(item.arguments["code"])
                    infra = _infra_failure(result, self.timeouts_are_infra)
                    if infra:  # the rollout masks the episode: no observation, no reward from here
                        return [], 0.0, True, {"infra_failure": infra, "tool_calls": ran + 1}
                    ran += 1
                    errors += result.error is not None
                    content = format_tool_result(result)
                else:
                    errors += 1
                    content = f"Error: {item.message}"
                messages.append({"role": "tool", "content": content})
            if len(turn.items) > self.max_calls_per_turn:
                skipped = len(turn.items) - self.max_calls_per_turn
                messages.append(
                    {
                        "role": "tool",
                        "content": f"Error: at most {self.max_calls_per_turn} calls per turn; "
                        f"{skipped} more were not run",
                    }
                )
            info = {
                "tool_calls": ran,
                "tool_errors": errors,
                "malformed_calls": len(turn.errors),
                "trailing_text": bool(turn.trailing_text),
            }
            reward = -float(self.trailing_text_penalty) if turn.trailing_text else 0.0
            return messages, reward, False, info
        answer = extract_boxed(text)
        reward = math_reward(
            text, str(self.task["answer"]), format_penalty=self.format_penalty, verifier=self.verifier
        )
        info = {"answer": answer, "correct": reward == 1.0}
        self._release_sandbox()
        return [], reward, True, info

    def _on_truncate(self) -> float:
        # the turn limit ended the episode before any final answer
        self._release_sandbox()
        return -float(self.format_penalty)

    def close(self) -> None:
        """Close the episode's sandbox."""
        self._release_sandbox()
        super().close()
