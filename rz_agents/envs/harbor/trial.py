"""One trial of a Harbor task: build its environment in a sandbox, let someone work, run its verifier.

    trial = Trial(task)            # builds the environment (a fresh workspace; built once per task
                                   # and copied per trial)
    trial.shell.run("ls")          # the agent's commands (or trial.run_solution() for the oracle)
    reward = trial.verify()        # uploads tests/ to /tests, runs `bash /tests/test.sh`, reads
                                   # /logs/verifier/reward.txt or reward.json
    trial.close()                  # deletes the workspace; no process is left (see shell.py)

Build failures raise :class:`BuildError` (the infrastructure's failure, masked by the env, never a 0
reward); a verifier that writes no reward scores 0.0 with the reason in ``VerifyResult.error``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from rz_agents.envs.harbor.dockerfile import BuildPlan, PlanError, plan_build
from rz_agents.envs.harbor.shell import ShellLimits, ShellResult, ShellSandbox, give_to, remove_tree
from rz_agents.envs.harbor.task import HarborTask

_CACHE_LOCK = threading.Lock()


class BuildError(RuntimeError):
    """The task's environment could not be built here."""


@dataclass
class VerifyResult:
    """The verifier's verdict."""

    reward: float
    output: str
    error: str | None = None  # why no reward was read (the reward is then 0.0)


def task_plan(task: HarborTask) -> BuildPlan:
    """The task's build plan; raises :class:`PlanError` when it cannot be built here."""
    if task.docker_image is not None and task.dockerfile is None:
        raise PlanError(
            f"prebuilt image {task.docker_image!r} (no Dockerfile): no registry is reachable here"
        )
    assert task.dockerfile is not None
    return plan_build(task.dockerfile.read_text(encoding="utf-8"))


def _context_digest(task: HarborTask) -> str:
    h = hashlib.sha256()
    for p in sorted(task.environment_dir.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(task.environment_dir)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _copy_into(task: HarborTask, sources: list[str], dest: str, plan: BuildPlan, workspace: Path) -> None:
    target = workspace / os.path.relpath(dest, plan.root)
    many = len(sources) > 1 or dest.endswith("/")
    for src in sources:
        path = (task.environment_dir / src).resolve()
        if not str(path).startswith(str(task.environment_dir.resolve())) or not path.exists():
            raise BuildError(f"COPY source {src!r} is not in the build context")
        if path.is_dir():  # as Docker does: a directory's contents go into the destination
            shutil.copytree(path, target, dirs_exist_ok=True)
        else:
            out = target / path.name if (many or target.is_dir()) else target
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, out)


def build_workspace(task: HarborTask, workspace: Path, limits: ShellLimits) -> BuildPlan:
    """Run the task's build plan into ``workspace`` (an empty directory)."""
    try:
        plan = task_plan(task)
    except PlanError as exc:
        raise BuildError(str(exc)) from None
    workspace.mkdir(parents=True, exist_ok=True)
    wall = min(task.limits.build_timeout_s, 600.0)
    for kind, value in plan.steps:
        if kind == "copy":
            sources, dest = plan.copies[int(value)]  # type: ignore[arg-type]
            _copy_into(task, sources, dest, plan, workspace)
            continue
        shell = ShellSandbox(workspace, root=plan.root, workdir=plan.workdir, env=plan.env, limits=limits)
        result = shell.run(str(value), wall_s=wall)
        if result.exit_code != 0:
            why = "timed out" if result.timed_out else f"exit {result.exit_code}"
            raise BuildError(f"RUN {value!r} failed ({why}): {result.output[-400:]}")
    return plan


def _cache_root() -> Path:
    return Path(os.environ.get("RZ_HARBOR_CACHE", Path(tempfile.gettempdir()) / "rz-harbor-cache"))


def cached_build(task: HarborTask, limits: ShellLimits) -> tuple[Path, BuildPlan]:
    """The task's built workspace template (built once per content digest, reused after)."""
    key = f"{task.name}-{_context_digest(task)}"
    template = _cache_root() / key
    with _CACHE_LOCK:
        if (template / ".built").is_file():
            return template / "ws", task_plan(task)
        remove_tree(template)
        template.mkdir(parents=True)
        try:
            plan = build_workspace(task, template / "ws", limits)
        except BaseException:
            remove_tree(template)
            raise
        (template / ".built").write_text("ok")
        return template / "ws", plan


class Trial:
    """A fresh copy of the task's environment, a shell in it, and its verifier."""

    def __init__(self, task: HarborTask, limits: ShellLimits | None = None, cache: bool = True) -> None:
        self.task = task
        self.limits = limits or ShellLimits()
        self.dir = Path(tempfile.mkdtemp(prefix=f"rz-harbor-{task.name[:40]}-"))
        try:
            if cache:
                template, self.plan = cached_build(task, self.limits)
                shutil.copytree(template, self.dir / "ws", symlinks=True)
            else:
                self.plan = build_workspace(task, self.dir / "ws", self.limits)
            self.shell = ShellSandbox(
                self.dir / "ws",
                root=self.plan.root,
                workdir=self.plan.workdir,
                env=self.plan.env,
                limits=self.limits,
            )
        except BaseException:
            remove_tree(self.dir)
            raise

    def run(self, command: str, wall_s: float | None = None) -> ShellResult:
        """One command in the trial's shell."""
        return self.shell.run(command, wall_s)

    def _with_binds(
        self, binds: list[tuple[Path, str, bool]], env: dict[str, str] | None = None
    ) -> ShellSandbox:
        return ShellSandbox(
            self.shell.workspace,
            root=self.plan.root,
            workdir=self.plan.workdir,
            env={**self.plan.env, **(env or {})},
            limits=self.limits,
            binds=binds,
            uid=self.shell.uid,
        )

    def run_solution(self) -> ShellResult:
        """The oracle: run the task's ``solution/solve.sh`` in the trial's shell."""
        if self.task.solution_dir is None:
            raise BuildError(f"{self.task.name}: no solution/solve.sh")
        copy = self.dir / "solution"
        shutil.copytree(self.task.solution_dir, copy)
        give_to(copy, self.shell.uid)
        shell = self._with_binds([(copy, "/solution", False)])
        return shell.run("bash /solution/solve.sh", wall_s=self.task.limits.agent_timeout_s)

    def verify(self) -> VerifyResult:
        """Upload tests/ to /tests, run ``bash /tests/test.sh``, read the reward it wrote."""
        tests, logs = self.dir / "tests", self.dir / "logs"
        shutil.rmtree(tests, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
        shutil.copytree(self.task.tests_dir, tests)  # a fresh copy: the agent never saw or touched it
        (logs / "verifier").mkdir(parents=True)
        give_to(tests, self.shell.uid)
        give_to(logs, self.shell.uid)
        shell = self._with_binds([(tests, "/tests", False), (logs, "/logs", True)], self.task.verifier_env)
        result = shell.run("bash /tests/test.sh", wall_s=self.task.limits.verifier_timeout_s)
        reward, error = read_reward(logs / "verifier")
        if result.timed_out:
            error = (error + "; " if error else "") + "verifier timed out"
        return VerifyResult(reward, result.output, error)

    def close(self) -> None:
        """Delete the trial's files."""
        remove_tree(self.dir)

    def __enter__(self) -> Trial:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_reward(verifier_dir: Path) -> tuple[float, str | None]:
    """The reward the verifier wrote (reward.txt: a number; reward.json: {"reward": x}), clamped to [0, 1]."""
    txt, js = verifier_dir / "reward.txt", verifier_dir / "reward.json"
    try:
        if txt.is_file():
            value = float(txt.read_text().strip())
        elif js.is_file():
            data = json.loads(js.read_text())
            value = float(data["reward"] if isinstance(data, dict) else data)
        else:
            return 0.0, "the verifier wrote no reward file"
    except (ValueError, KeyError, TypeError) as exc:
        return 0.0, f"unreadable reward: {exc}"
    if value != value:  # NaN
        return 0.0, "reward is NaN"
    return min(1.0, max(0.0, value)), None
