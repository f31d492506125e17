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
from collections.abc import Callable
from typing import Any

from rz_agents.envs.osworld import chrome_keep
from rz_agents.envs.osworld.actions import SPECIAL, Action, ActionParseError, computer13_to_code
from rz_agents.envs.osworld.cache import default_cache_dir
from rz_agents.envs.osworld.chrome import ChromeLink, chromium_binary
from rz_agents.envs.osworld.client import VMClient
from rz_agents.envs.osworld.context import EpisodeContext
from rz_agents.envs.osworld.evaluate import Evaluation, evaluate_episode
from rz_agents.envs.osworld.providers import make_provider
from rz_agents.envs.osworld.setup_steps import SetupError, run_steps, wait_for_pages_loaded
from rz_agents.envs.osworld.task import Task, parse_task

# A fresh profile's prefs per Chromium binary (one read serves every desktop of the process).
_DEFAULT_PREFS: dict[str, dict[str, Any]] = {}


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
        keep_browser: bool = False,
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
        # keep_browser: a chrome task's Chromium outlives its episode and is cleaned over DevTools
        # for the next chrome task instead of restarted (chrome_keep.py; local provider only)
        options = dict(provider_options or {})
        keep_browser = keep_browser or bool(options.get("keep_browser"))  # the gym env passes it there
        if keep_browser:
            if provider_name != "local":
                raise ValueError(f"keep_browser needs the local provider, got {provider_name!r}")
            options["keep_browser"] = True
        self.keep_browser = keep_browser
        self.provider = make_provider(provider_name, **options)
        self.browser_kept = False  # whether the last reset kept the browser
        self.fresh_browser_reasons: dict[str, int] = {}  # why resets started Chrome afresh, counted
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
        cleaner = self._browser_cleaner(task)
        # stops the previous desktop (or resets it in place, maybe keeping its browser)
        desktop = self.provider.start(cleaner) if cleaner else self.provider.start()
        self.browser_kept = bool(getattr(self.provider, "last_reset_kept_browser", False))
        client = VMClient(desktop.server_url)
        client.wait_ready()
        self.ctx = EpisodeContext(
            client=client,
            chrome=self._chrome_link(desktop.cdp_port, same_browser=self.browser_kept),
            task_id=task.id if task else "none",
            download_cache=self.download_cache,
            work_dir=tempfile.mkdtemp(prefix="rz-osworld-eval-"),
            allow_network=self.allow_network,
            browser_running=self._browser_probe(),
        )
        self.task = task
        self.action_history = []
        self.last_evaluation = None
        if task is not None:
            try:
                self._run_setup(task)
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

    def observe(self) -> dict[str, Any]:
        """The desktop's observation now, without running an action (as ``step`` returns it)."""
        if self.ctx is None:
            raise RuntimeError("DesktopEnv.observe() called before reset()")
        return self._get_obs()

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

    def _browser_probe(self) -> Callable[[], bool] | None:
        """Whether the episode's Chromium runs, when the provider can see its processes (local)."""
        browser_pids = getattr(self.provider, "browser_pids", None)
        if browser_pids is None:
            return None
        return lambda: bool(browser_pids(helpers=False))

    def _chrome_link(self, cdp_port: int, same_browser: bool = False) -> ChromeLink:
        if self._link is None:
            self._link = ChromeLink(cdp_port)
        elif not same_browser:
            self._link.retarget(cdp_port)
        return self._link

    # -- a kept browser (chrome_keep.py) ----------------------------------------------------------
    def _browser_cleaner(self, task: Task | None) -> Callable[[], str | None] | None:
        """What cleans the running browser at this reset, or None for a fresh one (and why, counted)."""
        if not self.keep_browser:
            return None
        steps = [(s.type, s.parameters) for s in task.config] if task is not None else []
        reason = chrome_keep.fresh_browser_reason(steps) if task is not None else "no task"
        defaults = _DEFAULT_PREFS.get(self._chromium_key())
        if reason is None and defaults is None:
            reason = "no fresh profile's prefs read yet (the first chrome task reads them)"
        if reason is not None:
            self.fresh_browser_reasons[reason] = self.fresh_browser_reasons.get(reason, 0) + 1
            return None
        link = self._link

        def clean() -> str | None:
            if link is None:
                return "no DevTools link"
            try:
                link.release()  # Playwright would attach to, and follow, every tab the cleaning opens
                chrome_keep.clean_browser(link.endpoint, defaults)
            except Exception as exc:  # noqa: BLE001 - any failure means a fresh browser
                return f"{type(exc).__name__}: {exc}"
            return None

        return clean

    @staticmethod
    def _chromium_key() -> str:
        return chromium_binary() or ""

    def _run_setup(self, task: Task) -> None:
        """The task's setup; with a kept browser its first Chrome launch opens a window of it."""
        assert self.ctx is not None
        steps = task.config
        launch = next(
            (
                i
                for i, s in enumerate(steps)
                if chrome_keep.chrome_launch_urls(s.type, s.parameters) is not None
            ),
            None,
        )
        if not self.browser_kept or launch is None:
            run_steps(self.ctx, steps)
            if self.keep_browser and launch is not None and self._chromium_key() not in _DEFAULT_PREFS:
                self._read_default_prefs(steps)
            return
        run_steps(self.ctx, steps[:launch])
        urls = chrome_keep.chrome_launch_urls(steps[launch].type, steps[launch].parameters) or []
        w, h = getattr(self.provider, "screen_size", (1920, 1080))
        chrome_keep.open_window(self.ctx.chrome.endpoint, urls, (0, 0, w, h))
        wait_for_pages_loaded(self.ctx)
        run_steps(self.ctx, steps[launch + 1 :])

    def _read_default_prefs(self, steps: list) -> None:
        """A fresh profile's prefs, once per Chromium binary: read right after a setup that started
        Chrome afresh and touched nothing of it (``fresh_browser_reason`` is None)."""
        assert self.ctx is not None
        if chrome_keep.fresh_browser_reason([(s.type, s.parameters) for s in steps]) is not None:
            return
        try:
            prefs = chrome_keep.default_prefs(self.ctx.chrome.endpoint)
        except Exception as exc:  # noqa: BLE001 - the next chrome task tries again
            self.ctx.notes.append(f"keep_browser: prefs not read: {type(exc).__name__}: {exc}")
            return
        _DEFAULT_PREFS.setdefault(self._chromium_key(), prefs)

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
