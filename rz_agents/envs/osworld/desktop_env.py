"""A DesktopEnv-compatible API (as in OSWorld's ``desktop_env``) on our providers.

``reset(task_config)`` starts a fresh desktop and runs the task's setup steps; ``step(action,
pause)`` runs one action (pyautogui code, a computer_13 dict, or ``WAIT``/``DONE``/``FAIL``);
``evaluate()`` scores the episode; observations are ``{"screenshot": PNG bytes,
"accessibility_tree": XML, "terminal": text or None, "instruction": str}``. With
``a11y_view="agent"`` the tree holds only the nodes OSWorld's text agent keeps (the RL env's
choice: the same ``linearize`` table for a fraction of the desktop's CPU).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any

from rz_agents.envs.osworld.actions import SPECIAL, Action, ActionParseError, computer13_to_code
from rz_agents.envs.osworld.cache import default_cache_dir
from rz_agents.envs.osworld.chrome import ChromeLink
from rz_agents.envs.osworld.client import VMClient
from rz_agents.envs.osworld.context import EpisodeContext
from rz_agents.envs.osworld.evaluate import Evaluation, evaluate_episode
from rz_agents.envs.osworld.providers import make_provider
from rz_agents.envs.osworld.setup_steps import SetupError, run_steps
from rz_agents.envs.osworld.task import Task, parse_task


class DesktopEnv:
    """One desktop at a time; ``reset`` reverts to a clean state, ``close`` frees every process."""

    def __init__(
        self,
        provider_name: str = "local",
        action_space: str = "pyautogui",
        require_a11y_tree: bool = True,
        require_terminal: bool = False,
        require_screenshot: bool = True,
        download_cache: str | None = None,
        allow_network: bool = False,
        provider_options: dict[str, Any] | None = None,
        a11y_view: str = "full",
    ) -> None:
        if action_space not in ("pyautogui", "computer_13"):
            raise ValueError(f"action_space must be 'pyautogui' or 'computer_13', got {action_space!r}")
        if a11y_view not in ("full", "agent"):
            raise ValueError(f"a11y_view must be 'full' or 'agent', got {a11y_view!r}")
        self.action_space = action_space
        self.a11y_view = a11y_view
        self.require_a11y_tree = require_a11y_tree
        self.require_terminal = require_terminal
        self.require_screenshot = require_screenshot
        self.download_cache = download_cache or default_cache_dir()
        self.allow_network = allow_network
        self.provider = make_provider(provider_name, **(provider_options or {}))
        self.task: Task | None = None
        self.ctx: EpisodeContext | None = None
        self.action_history: list[str] = []
        self.last_evaluation: Evaluation | None = None
        self.timings: dict[str, float] = {}
        self._link: ChromeLink | None = None

    # -- episode ---------------------------------------------------------------------------------
    def reset(
        self, task_config: dict[str, Any] | Task | None = None, seed: int | None = None
    ) -> dict[str, Any]:
        """Start a fresh desktop for ``task_config`` and run its setup; returns the first observation.

        (A provider with ``warm_reset`` may instead reset the running desktop in place, once its
        clean state verifies; see ``providers/warm.py``.)

        Raises ``TaskFormatError`` for a malformed task and ``SetupError`` when a setup step
        cannot run (the message says why, e.g. it needs the internet); the desktop is then stopped.
        """
        t0 = time.perf_counter()
        task = (
            task_config if isinstance(task_config, Task) or task_config is None else parse_task(task_config)
        )
        self._end_episode()
        desktop = self.provider.start()  # stops the previous desktop (or resets it in place)
        client = VMClient(desktop.server_url)
        client.wait_ready()
        self.ctx = EpisodeContext(
            client=client,
            chrome=self._chrome_link(desktop.cdp_port),
            task_id=task.id if task else "none",
            download_cache=self.download_cache,
            work_dir=tempfile.mkdtemp(prefix="rz-osworld-eval-"),
            allow_network=self.allow_network,
        )
        self.task = task
        self.action_history = []
        self.last_evaluation = None
        if task is not None:
            try:
                run_steps(self.ctx, task.config)
            except SetupError:
                self._stop_episode()
                raise
        self.timings["reset_s"] = time.perf_counter() - t0
        return self._get_obs()

    def step(
        self, action: str | dict[str, Any], pause: float = 0.5, *, observe: bool = True
    ) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """Run one action, wait ``pause`` seconds, observe. ``done`` after ``DONE`` or ``FAIL``.

        A malformed action is not run: ``info["error"]`` says why and the episode goes on.
        ``observe=False`` skips the observation (its fields are None): for an action whose
        observation nobody reads, as all but the last of a reply's actions.
        """
        if self.ctx is None:
            raise RuntimeError("DesktopEnv.step() called before reset()")
        t0 = time.perf_counter()
        info: dict[str, Any] = {}
        try:
            act = self._to_action(action)
        except ActionParseError as exc:
            info["error"] = str(exc)
            return self._get_obs(observe), 0.0, False, info
        self.action_history.append(act.label)
        done = False
        if act.kind == "WAIT":
            time.sleep(pause)
        elif act.kind in ("DONE", "FAIL"):
            done = True
            info["done"] = act.kind
        else:
            result = self.ctx.client.run_python(act.code)
            if result.get("returncode") not in (0, None) or result.get("status") != "success":
                # The traceback's last lines tell the agent what went wrong.
                info["error"] = "\n".join((result.get("error") or "").strip().splitlines()[-5:])
            time.sleep(pause)
        self.timings["step_s"] = time.perf_counter() - t0
        return self._get_obs(observe), 0.0, done, info

    def _to_action(self, action: str | dict[str, Any] | Action) -> Action:
        if isinstance(action, Action):
            return action
        if isinstance(action, dict):
            return computer13_to_code(action)
        if not isinstance(action, str):
            raise ActionParseError(f"an action must be code text or a dict, got {type(action).__name__}")
        text = action.strip()
        if text in SPECIAL:
            return Action(text)
        if self.action_space == "computer_13":
            raise ActionParseError("the computer_13 action space takes dict actions (or WAIT/DONE/FAIL)")
        try:
            compile(text, "<action>", "exec")
        except SyntaxError as exc:
            raise ActionParseError(f"the action is not valid Python (line {exc.lineno}: {exc.msg})") from exc
        return Action("code", text)

    def evaluate(self) -> float:
        """Score the episode (OSWorld rules, incl. infeasible tasks); details in ``last_evaluation``."""
        if self.ctx is None or self.task is None:
            raise RuntimeError("DesktopEnv.evaluate() needs a task: call reset(task_config) first")
        t0 = time.perf_counter()
        self.last_evaluation = evaluate_episode(self.ctx, self.task.evaluator, self.action_history)
        self.timings["evaluate_s"] = time.perf_counter() - t0
        return self.last_evaluation.score

    def _get_obs(self, observe: bool = True) -> dict[str, Any]:
        assert self.ctx is not None
        client = self.ctx.client
        return {
            "screenshot": client.screenshot() if observe and self.require_screenshot else None,
            "accessibility_tree": client.accessibility_tree(self.a11y_view)
            if observe and self.require_a11y_tree
            else None,
            "terminal": client.terminal_output() if observe and self.require_terminal else None,
            "instruction": self.task.instruction if self.task else "",
        }

    def _chrome_link(self, cdp_port: int) -> ChromeLink:
        if self._link is None:
            self._link = ChromeLink(cdp_port)
        else:
            self._link.retarget(cdp_port)
        return self._link

    def _end_episode(self) -> None:
        ctx, self.ctx = self.ctx, None
        if ctx is not None:
            shutil.rmtree(ctx.work_dir, ignore_errors=True)

    def _stop_episode(self) -> None:
        self._end_episode()
        self.provider.stop()

    def close(self) -> None:
        """Stop the desktop and every process it started (and Playwright's driver); safe to call twice."""
        self._stop_episode()
        if self._link is not None:
            self._link.close()
            self._link = None

    def __enter__(self) -> DesktopEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
