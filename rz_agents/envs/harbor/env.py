"""``ShellTaskEnv``: a Harbor terminal task solved with a sandboxed shell (``rz_agents/ShellTask-v0``).

Each episode builds the task's environment in a fresh bubblewrap workspace (``trial.py``), shows the
policy the task's instruction, and runs each ``bash`` tool call (Qwen3/Hermes ``<tool_call>`` blocks) as
a command in that workspace, returning its exit code and output. A turn without a tool call says the
agent is done: the task's own verifier (``tests/test.sh``) then scores the workspace (0/1 or partial),
and the episode ends with that reward. The turn limit ends it the same way (the workspace is scored as
it is). An environment that cannot be built, or a sandbox that cannot start, is the infrastructure's
failure (``info["infra_failure"]``): the rollout masks the episode instead of scoring it.

Tasks come from ``tasks`` (a folder of Harbor tasks, searched recursively; default: the packaged set)
or per episode as ``reset(options={"task": {"path": DIR}})``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rz_agents.envs.base import Message, MultiTurnTextEnv, ToolSpec
from rz_agents.envs.harbor.shell import SandboxUnavailable, ShellLimits, ShellResult
from rz_agents.envs.harbor.task import HarborTask, find_tasks, load_task, packaged_tasks_dir
from rz_agents.envs.harbor.trial import BuildError, Trial, VerifyResult
from rz_agents.envs.tool_calls import ToolCall, parse_tool_calls

BASH_TOOL: ToolSpec = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": (
            "Run a bash command in the task's workspace and return its exit code and output. Files persist "
            "between commands; processes do not (each command runs to completion)."
        ),
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command to run."}},
            "required": ["command"],
        },
    },
}

SYSTEM_PROMPT = (
    "You are an expert at the Linux command line. Solve the task by calling the `bash` tool. "
    "When the task is done, reply without a tool call."
)


class CommandRefused(ValueError):
    """A command the episode's sandbox does not run (its message is what the agent is told)."""


def format_result(result: ShellResult) -> str:
    """What the policy sees for one command: the exit code (or the timeout) and the output."""
    status = "timed out (killed)" if result.timed_out else f"exit code {result.exit_code}"
    output = result.output.rstrip("\n")
    return f"[{status}]\n{output}" if output else f"[{status}]"


class ShellTaskEnv(MultiTurnTextEnv):
    """A Harbor task, one sandboxed workspace per episode, the task's verifier as the reward.

    ``command_timeout_s``: wall time of one command (the task's ``[agent].timeout_sec`` also bounds the
    episode's total command time). ``max_calls_per_turn``: calls run per turn (the rest get an error).
    ``names``: only these task names from ``tasks``. ``advertise_tools``: put the bash tool in
    ``info["tools"]`` (the rendered prompt).
    """

    def __init__(
        self,
        max_turns: int = 8,
        tasks: str | list[str] | None = None,
        names: list[str] | None = None,
        command_timeout_s: float = 30.0,
        max_calls_per_turn: int = 4,
        output_bytes: int = 8192,
        system_prompt: str | None = SYSTEM_PROMPT,
        advertise_tools: bool = True,
    ) -> None:
        super().__init__(max_turns=max_turns)
        folders = [tasks] if isinstance(tasks, str) else list(tasks or [str(packaged_tasks_dir())])
        paths = [p for folder in folders for p in find_tasks(folder)]
        if names is not None:
            wanted = set(names)
            paths = [p for p in paths if p.name in wanted]
            missing = wanted - {p.name for p in paths}
            if missing:
                raise ValueError(f"names: no such Harbor tasks: {sorted(missing)}")
        self.task_paths = paths
        self.limits = ShellLimits(wall_s=command_timeout_s, output_bytes=output_bytes)
        self.max_calls_per_turn = max_calls_per_turn
        self.system_prompt = system_prompt
        self.advertise_tools = advertise_tools
        self.tools = [BASH_TOOL]
        self.task: HarborTask | None = None
        self.trial: Trial | None = None
        self.command_s = 0.0

    def _pick(self, task: dict[str, Any] | None, rng: np.random.Generator) -> HarborTask:
        if task is not None:
            if "path" not in task:
                raise ValueError(f"a Harbor task is given as {{'path': DIR}}, got keys {sorted(task)}")
            return load_task(task["path"])
        if not self.task_paths:
            raise ValueError("no Harbor tasks to draw from (tasks= found none)")
        return load_task(self.task_paths[int(rng.integers(len(self.task_paths)))])

    def _reset(self, task: dict[str, Any] | None, rng: np.random.Generator) -> tuple[list[Message], dict]:
        self._close_trial()
        self.task = self._pick(task, rng)
        self.command_s = 0.0
        info: dict[str, Any] = {
            "task_id": self.task.name,
            "tools": list(self.tools) if self.advertise_tools else [],
        }
        try:
            self.trial = Trial(self.task, self.limits)
        except (BuildError, SandboxUnavailable, OSError) as exc:
            info["infra_failure"] = f"environment of {self.task.name} not built: {exc}"
        messages: list[Message] = [{"role": "user", "content": self.task.instruction}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages, info

    def run_command(self, command: object, wall_s: float | None = None) -> ShellResult:
        """One command in the episode's sandbox (what the bash tool runs; an external agent's commands
        too), within ``command_timeout_s`` (or ``wall_s``, if shorter) and the task's time for commands.
        CommandRefused (its message for the agent) for an empty command, time used up or no environment."""
        if self.trial is None or self.task is None:
            raise CommandRefused("no environment (the episode is over, or its build failed at reset)")
        if not isinstance(command, str) or not command.strip():
            raise CommandRefused("the bash tool needs a non-empty string argument `command`")
        left = self.task.limits.agent_timeout_s - self.command_s
        if left <= 0:
            budget = self.task.limits.agent_timeout_s
            raise CommandRefused(f"the task's time for commands ({budget:g} s) is used up")
        wall = min(self.limits.wall_s, left)
        if wall_s is not None and wall_s > 0:
            wall = min(wall, float(wall_s))
        result = self.trial.run(command, wall_s=wall)
        self.command_s += result.duration_s
        return result

    def _run(self, call: ToolCall) -> str:
        try:
            return format_result(self.run_command(call.arguments.get("command")))
        except CommandRefused as exc:
            return f"Error: {exc}"

    def _step(self, text: str) -> tuple[list[Message], float, bool, dict]:
        if self.trial is None:
            return [], 0.0, True, {"infra_failure": "no environment (its build failed at reset)"}
        turn = parse_tool_calls(text, self.tools)
        if not turn.has_calls:
            return self._finish({"finished_by": "agent"})
        messages: list[Message] = []
        ran = 0
        for item in turn.items[: self.max_calls_per_turn]:
            if isinstance(item, ToolCall):
                ran += 1
                content = self._run(item)
            else:
                content = f"Error: {item.message}"
            messages.append({"role": "tool", "content": content})
        skipped = len(turn.items) - self.max_calls_per_turn
        if skipped > 0:
            messages.append(
                {
                    "role": "tool",
                    "content": f"Error: at most {self.max_calls_per_turn} calls per turn; "
                    f"{skipped} more were not run",
                }
            )
        info = {"tool_calls": ran, "malformed_calls": len(turn.errors)}
        return messages, 0.0, False, info

    def verify(self) -> VerifyResult:
        """Score the workspace as it stands with the task's verifier and end the episode (its workspace is
        deleted): what a turn without a tool call does, for an agent that drives the sandbox itself."""
        assert self.trial is not None, "verify() needs an environment built by reset()"
        verdict = self.trial.verify()
        self._close_trial()
        return verdict

    def _finish(self, info: dict[str, Any]) -> tuple[list[Message], float, bool, dict]:
        assert self.trial is not None
        verdict = self.trial.verify()
        info = {
            **info,
            "reward": verdict.reward,
            "verifier_error": verdict.error,
            "command_s": self.command_s,
        }
        self._close_trial()
        return [], verdict.reward, True, info

    def _on_truncate(self) -> float:
        if self.trial is None:
            return 0.0
        verdict = self.trial.verify()
        self._close_trial()
        return verdict.reward

    def _close_trial(self) -> None:
        if self.trial is not None:
            self.trial.close()
            self.trial = None

    def close(self) -> None:
        """Delete the episode's workspace (no process of it outlives its command)."""
        self._close_trial()
        super().close()


def task_names(folder: str | Path | None = None) -> list[str]:
    """The names of the Harbor tasks under ``folder`` (default: the packaged set)."""
    return [p.name for p in find_tasks(folder or packaged_tasks_dir())]
