"""``MiniSweAgent``: mini-swe-agent, unmodified, trained on Harbor terminal tasks (``agent.kind: miniswe``).

An episode runner (rollout/episode_runner.py). Per episode:

1. the Harbor task's environment is built in a fresh bubblewrap workspace (``ShellTaskEnv``, the sandbox
   of ``rz_agents/ShellTask-v0``; a build that fails is the infrastructure's failure: masked, rerun);
2. a token-exact ``rz serve`` session of the run's engine is opened (the OpenAI-API agent's endpoint,
   agents/openai_api/endpoint.py) and a command endpoint serves the workspace (command_endpoint.py);
3. the ``mini`` CLI of mini-swe-agent runs as a subprocess of its own interpreter (its venv:
   scripts/install_miniswe.sh) with a config that points its litellm model at the session
   (``openai/<model_name>``, ``api_base``) and its environment at the sandbox (the shim class
   ``rz_sandbox_environment.RzSandboxEnvironment``): configuration, no change to its code;
4. when it exits (it submitted, reached its step limit, or the session refused a request past the episode's
   limits), the task's verifier scores the workspace: the reward. The session's tokens (exactly what the
   engine sampled, with log-probs and versions, every segment) are the Trajectory.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import yaml

from rz_agents.agents.miniswe.command_endpoint import CommandEndpoint
from rz_agents.agents.miniswe.processes import (  # noqa: F401 (run_killable: public here too)
    Cancelled,
    EpisodeChildren,
    kill_process_groups,
    run_killable,
)
from rz_agents.agents.openai_api.agent import episode_session_policy
from rz_agents.agents.openai_api.endpoint import served_endpoint
from rz_agents.envs.harbor.env import ShellTaskEnv
from rz_agents.rollout.agent_loop import EpisodeError, EpisodeLimits, EpisodeSpec, InfraFailure
from rz_agents.trajectory import Trajectory

HERE = Path(__file__).resolve().parent
SHIM_DIR = HERE / "shim"  # put on mini-swe-agent's PYTHONPATH: the environment class it loads
DEFAULT_CONFIG = HERE / "rz_terminal.yaml"
ENVIRONMENT_CLASS = "rz_sandbox_environment.RzSandboxEnvironment"
DEFAULT_VENV = "/work/venvs/miniswe"  # scripts/install_miniswe.sh's default


def miniswe_python(python: str | None = None) -> str:
    """The interpreter that has mini-swe-agent: ``python``, else ``$RZ_MINISWE_PYTHON``, else the venv
    scripts/install_miniswe.sh makes (``$RZ_MINISWE_VENV``, default /work/venvs/miniswe)."""
    if python:
        return python
    if os.environ.get("RZ_MINISWE_PYTHON"):
        return os.environ["RZ_MINISWE_PYTHON"]
    return str(Path(os.environ.get("RZ_MINISWE_VENV", DEFAULT_VENV)) / "bin" / "python")


def miniswe_problem(python: str | None = None) -> str | None:
    """Why mini-swe-agent cannot run from ``miniswe_python(python)``, or None when it can."""
    exe = miniswe_python(python)
    if not Path(exe).is_file():
        return f"no interpreter at {exe} (make the venv with scripts/install_miniswe.sh)"
    probe = subprocess.run(
        [exe, "-c", "import minisweagent.run.mini"],
        env={**_base_env(), "MSWEA_GLOBAL_CONFIG_DIR": tempfile.gettempdir()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        return f"{exe} cannot import mini-swe-agent: {probe.stderr.strip()[-300:]}"
    return None


def _base_env() -> dict[str, str]:
    """The agent process's environment: nothing of the host's but PATH and the locale (no keys, no proxy,
    which would send the local session's requests elsewhere)."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
    return {
        **keep,
        "MSWEA_CONFIGURED": "true",  # no first-run setup prompt
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_COST_TRACKING": "ignore_errors",  # a local model has no price
        "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",  # a refused request ends the run: no backoff retries
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm would fetch its price list from the internet
        "LITELLM_LOG": "ERROR",
        "NO_PROXY": "127.0.0.1,localhost",
        "PYTHONPATH": str(SHIM_DIR),
        "PYTHONUNBUFFERED": "1",
    }


class MiniSweAgent:
    """An episode = mini-swe-agent on one Harbor task, its model a session of the run's engine.

    Args:
        python: the interpreter that has mini-swe-agent (``miniswe_python``).
        configs: mini-swe-agent config specs merged in order (files, or its built-in names such as
            ``mini.yaml``); default: rz's short prompts (rz_terminal.yaml). rz's own settings (model,
            environment, step limit) are merged last.
        tasks / names: the Harbor tasks (a folder, default the packaged set; only these names), drawn per
            episode from its reset seed when the run gives no ``env.tasks`` (``{path: DIR}`` each).
        command_timeout_s: wall time of one command (the task's ``[agent].timeout_sec`` bounds them all).
        timeout_s: wall time of the whole mini-swe-agent process (killed past it; the episode is dropped).
        model_name: the model id the endpoint serves.
    """

    uses_env = False  # it builds its own sandbox per episode: the controller builds no env for it

    def __init__(
        self,
        python: str | None = None,
        configs: Sequence[str] | None = None,
        tasks: str | list[str] | None = None,
        names: list[str] | None = None,
        command_timeout_s: float = 30.0,
        timeout_s: float = 900.0,
        model_name: str = "policy",
    ) -> None:
        self.python = miniswe_python(python)
        self.configs = [str(DEFAULT_CONFIG)] if configs is None else [str(c) for c in configs]
        self.tasks = tasks
        self.names = names
        self.command_timeout_s = float(command_timeout_s)
        self.timeout_s = float(timeout_s)
        self.model_name = model_name
        self._make_env(1)  # a bad task folder or name fails now, not in the first episode

    def _make_env(self, max_turns: int) -> ShellTaskEnv:
        return ShellTaskEnv(
            max_turns=max_turns,
            tasks=self.tasks,
            names=self.names,
            command_timeout_s=self.command_timeout_s,
            system_prompt=None,
            advertise_tools=False,
        )

    # ---- the episode ------------------------------------------------------------------------------------
    async def run_episode(
        self,
        engine,
        env,
        template,
        tokenizer,
        spec: EpisodeSpec,
        sampling,
        limits: EpisodeLimits,
        executor: Executor | None = None,
        infra_exceptions: Sequence[str] = (),
    ) -> Trajectory:
        """Build the task's sandbox, run mini-swe-agent on a fresh session, score the workspace; the
        session's Trajectory. ``env`` is None (``uses_env`` is False); ``infra_exceptions`` are unused."""
        loop = asyncio.get_running_loop()
        shell = self._make_env(limits.max_turns)
        try:
            reset_seed = spec.seed if spec.reset_seed is None else spec.reset_seed
            options = {"task": spec.task} if spec.task else None
            _, info = await loop.run_in_executor(
                executor, lambda: shell.reset(seed=reset_seed, options=options)
            )
            if info.get("infra_failure"):
                raise InfraFailure(info["infra_failure"])
            assert shell.task is not None
            return await self._run_on_session(
                engine, template, tokenizer, spec, sampling, limits, shell, executor
            )
        finally:
            await loop.run_in_executor(executor, shell.close)

    async def _run_on_session(
        self, engine, template, tokenizer, spec, sampling, limits, shell: ShellTaskEnv, executor
    ) -> Trajectory:
        loop = asyncio.get_running_loop()
        http = await served_endpoint(engine, tokenizer, template, self.model_name)
        store = http.server.sessions
        session_id = f"miniswe-{spec.group_id}-{spec.member}-{spec.seed}"
        session = store.open(session_id, episode_session_policy(spec, sampling, limits))
        commands = CommandEndpoint(shell)
        # the episode's mini process: killed if the episode is cancelled
        children = EpisodeChildren()
        try:
            try:
                run = await loop.run_in_executor(
                    executor, self._run_mini, http.session_url(session_id), commands, shell, limits, children
                )
            except asyncio.CancelledError:  # a stopping run: its worker thread must not wait up to timeout_s
                kill_process_groups(children)
                raise
            if run["returncode"] != 0 and session.limit_reached is None:
                raise EpisodeError(f"mini-swe-agent exited {run['returncode']}: {run['stderr'][-500:]}")
            if not session.turns:
                raise EpisodeError("mini-swe-agent made no request to its session: nothing sampled to train")
            verdict = await loop.run_in_executor(executor, shell.verify)
            info: dict[str, Any] = {
                "task_id": run["task_id"],
                "finish": session.limit_reached or run["exit_status"] or "agent_returned",
                "exit_status": run["exit_status"],
                "commands": commands.commands,
                "verifier_error": verdict.error,
                "member": spec.member,
                "seed": spec.seed,
                "reset_seed": spec.reset_seed,
            }
            try:
                return session.trajectory(verdict.reward, spec.group_id, info)
            except ValueError as e:
                raise EpisodeError(f"malformed session trajectory: {e}") from e
        finally:
            commands.close()
            store.close(session_id)

    def episode_config(
        self, base_url: str, commands: CommandEndpoint, limits: EpisodeLimits, out: Path
    ) -> dict[str, Any]:
        """rz's part of the episode's mini-swe-agent config (merged after ``configs``)."""
        return {
            "agent": {
                "agent_class": "default",  # the non-interactive agent: no confirmation prompts
                "step_limit": limits.max_turns,  # it stops itself where the session would refuse
                "cost_limit": 0,
                "wall_time_limit_seconds": int(self.timeout_s),
                "output_path": str(out),
            },
            "model": {  # its model class is the configs' (rz_terminal.yaml: litellm_textbased)
                "model_name": f"openai/{self.model_name}",
                "model_kwargs": {"api_base": base_url, "api_key": "rz"},
                "cost_tracking": "ignore_errors",
            },
            "environment": {
                "environment_class": ENVIRONMENT_CLASS,
                "url": commands.url,
                "token": commands.token,
                "timeout": max(1, int(self.command_timeout_s)),
            },
        }

    def _run_mini(
        self,
        base_url: str,
        commands: CommandEndpoint,
        shell: ShellTaskEnv,
        limits: EpisodeLimits,
        children: EpisodeChildren | None = None,
    ) -> dict[str, Any]:
        assert shell.task is not None
        task_id, instruction = shell.task.name, shell.task.instruction
        work = Path(tempfile.mkdtemp(prefix="rz-miniswe-"))
        try:
            out = work / "trajectory.json"
            config = self.episode_config(base_url, commands, limits, out)
            (work / "episode.yaml").write_text(yaml.safe_dump(config))
            argv = [self.python, "-m", "minisweagent.run.mini"]
            for spec in [*self.configs, str(work / "episode.yaml")]:
                argv += ["-c", spec]
            argv += ["-t", instruction, "-y", "--exit-immediately", "-o", str(out)]
            env = {**_base_env(), "HOME": str(work), "MSWEA_GLOBAL_CONFIG_DIR": str(work / "config")}
            try:
                done = run_killable(argv, env, work, self.timeout_s, children)
            except FileNotFoundError as e:
                raise EpisodeError(f"mini-swe-agent's interpreter {self.python}: {e}") from e
            except subprocess.TimeoutExpired as e:
                raise EpisodeError(f"mini-swe-agent ran past timeout_s ({self.timeout_s:g} s)") from e
            exit_status, messages = None, []
            if out.is_file():
                try:
                    saved = json.loads(out.read_text())
                    exit_status = saved.get("info", {}).get("exit_status") or None
                    messages = saved.get("messages") or []
                except (json.JSONDecodeError, AttributeError):
                    exit_status = None
            # messages: the agent's own history as it saved it (scripts/make_miniswe_demos.py keeps it)
            return {"returncode": done.returncode, "stderr": done.stderr + done.stdout[-2000:],
                    "exit_status": exit_status, "task_id": task_id, "messages": messages}  # fmt: skip
        finally:
            shutil.rmtree(work, ignore_errors=True)
