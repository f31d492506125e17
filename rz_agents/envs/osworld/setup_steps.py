"""Setup steps (a task's ``config`` and its evaluator's ``postconfig``), run from the host.

Each step type maps to one function ``(ctx, **parameters)``. Steps that need the internet
(``download`` of a file not in the cache, opening a remote page) raise ``SetupError`` with the
reason, as do unknown step types: the episode reports it instead of crashing the caller.
"""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from rz_agents.envs.osworld.cache import download_paths, first_existing, is_local_url
from rz_agents.envs.osworld.chrome import pages
from rz_agents.envs.osworld.chrome_history import step_update_browse_history
from rz_agents.envs.osworld.client import ServerError
from rz_agents.envs.osworld.context import EpisodeContext
from rz_agents.envs.osworld.live_web import PAGES_NOT_NEEDED
from rz_agents.envs.osworld.task import SetupStep


class SetupError(RuntimeError):
    """A setup step could not run; the message says why (e.g. it needs the internet)."""


def _command_ok(result: dict[str, Any], what: str) -> dict[str, Any]:
    if result.get("status") != "success":
        raise SetupError(f"{what}: {result.get('error') or result.get('message')}")
    return result


def step_execute(
    ctx: EpisodeContext, command: Any, shell: bool = False, stdout: str = "", stderr: str = "", **_: Any
) -> None:
    """Run a command to completion (its exit code is not checked, as in OSWorld).

    ``stdout``/``stderr`` name files in the episode's evaluation folder that receive the output
    (a later ``cache_file`` getter reads them).
    """
    result = _command_ok(ctx.client.execute(command, shell=shell), "execute")
    for name, text in ((stdout, result.get("output")), (stderr, result.get("error"))):
        if name:
            with open(os.path.join(ctx.work_dir, os.path.basename(name)), "w") as f:
                f.write(text or "")


def step_launch(ctx: EpisodeContext, command: Any, shell: bool = False, **_: Any) -> None:
    """Start a program in the background; wait for Chrome's CDP port when it is Chrome."""
    _command_ok(ctx.client.launch(command, shell=shell), "launch")
    first = command.split()[0] if isinstance(command, str) and command.split() else (command or [""])[0]
    if "chrom" in os.path.basename(str(first)):
        wait_for_chrome(ctx)
        wait_for_pages_loaded(ctx)


def wait_for_pages_loaded(ctx: EpisodeContext, timeout_s: float = 30.0) -> None:
    """Block until Chrome shows a tab and every tab has loaded, so the agent's first keys land.

    A slow page is noted, not fatal: OSWorld does not wait either, this only removes a race.
    """

    def wait(browser: Any) -> None:
        deadline = time.monotonic() + timeout_s
        while not pages(browser) and time.monotonic() < deadline:
            time.sleep(0.05)
        for page in pages(browser):
            page.wait_for_load_state("load", timeout=max(1.0, deadline - time.monotonic()) * 1000)

    try:
        ctx.chrome.call(wait, timeout_s=timeout_s + 10)
    except Exception as exc:
        ctx.notes.append(f"launch: pages not loaded: {type(exc).__name__}: {exc}")


def wait_for_chrome(ctx: EpisodeContext, timeout_s: float = 30.0, running_cap_s: float = 180.0) -> None:
    """Block until the episode's Chrome answers on its CDP port.

    Past ``timeout_s`` it keeps waiting, up to ``running_cap_s``, while the episode's Chromium
    process runs (``ctx.browser_running``): a start is ~0.5 CPU-s, so dozens of desktops starting
    at once on a few cores take longer than 30 s, and failing one then throws away a desktop that
    is nearly up (bench/osworld.py --pattern steady at 32 desktops lost 21 of them so). A Chromium
    that is not running, or a provider that cannot tell, fails at ``timeout_s``.
    """
    start = time.monotonic()
    url = ctx.chrome.endpoint + "/json/version"
    next_probe = start + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            now = time.monotonic()
            if now >= next_probe:  # at most once a second: the probe lists the desktop's processes
                running = ctx.browser_running is not None and ctx.browser_running()
                next_probe = now + 1.0
                if not running or now > start + running_cap_s:
                    why = (
                        " (its process runs but does not answer)"
                        if running
                        else " (no Chromium of the episode is running)"
                        if ctx.browser_running is not None
                        else ""
                    )
                    raise SetupError(
                        f"Chrome did not open its debugging port within {now - start:.0f}s{why}"
                    ) from None
            time.sleep(0.05)


def step_open(ctx: EpisodeContext, path: str, **_: Any) -> None:
    """Open a file with its default application."""
    _command_ok(ctx.client.open_file(path), "open")


def step_sleep(ctx: EpisodeContext, seconds: float, **_: Any) -> None:
    """Wait (capped at 60 s so a typo cannot stall an episode)."""
    time.sleep(min(float(seconds), 60.0))


def step_activate_window(
    ctx: EpisodeContext, window_name: str, strict: bool = False, by_class: bool = False, **_: Any
) -> None:
    """Focus a window, retrying briefly: it may still be opening."""
    deadline = time.monotonic() + 5
    while True:
        try:
            result = ctx.client.activate_window(window_name, strict, by_class)
        except ServerError:
            result = {}  # not there yet
        if result.get("status") == "success":
            return
        if time.monotonic() > deadline:
            # OSWorld logs and goes on when a window is missing; so do we, but say so.
            ctx.notes.append(f"activate_window: no window matching {window_name!r}")
            return
        time.sleep(0.2)


def step_close_window(
    ctx: EpisodeContext, window_name: str, strict: bool = False, by_class: bool = False, **_: Any
) -> None:
    """Close a window if it exists."""
    try:
        ctx.client.close_window(window_name, strict, by_class)
    except Exception as exc:
        ctx.notes.append(f"close_window: {exc}")


def step_download(ctx: EpisodeContext, files: list[dict[str, str]], **_: Any) -> None:
    """Place files in the desktop: from the download cache, a local URL, or (if allowed) the web."""
    for item in files:
        url, path = item["url"], item["path"]
        cached = first_existing(download_paths(ctx.download_cache, ctx.task_id, url, path))
        if cached:
            with open(cached, "rb") as f:
                data = f.read()
        elif is_local_url(url) or ctx.allow_network:
            try:
                with urllib.request.urlopen(url, timeout=60) as resp:
                    data = resp.read()
            except OSError as exc:
                raise SetupError(f"download of {url} failed: {exc}") from exc
        else:
            expected = download_paths(ctx.download_cache, ctx.task_id, url, path)[0]
            raise SetupError(f"needs internet download: {url} (put the file at {expected} to run offline)")
        ctx.client.upload(path, data)


def step_upload_file(ctx: EpisodeContext, files: list[dict[str, str]], **_: Any) -> None:
    """Copy local files (``local_path``) into the desktop (``path``)."""
    for item in files:
        with open(item["local_path"], "rb") as f:
            ctx.client.upload(item["path"], f.read())


def step_chrome_open_tabs(ctx: EpisodeContext, urls_to_open: list[str], **_: Any) -> None:
    """Open each URL in a new tab of the running Chrome (offline, a live page only for a task that does
    not need it: ``live_web.PAGES_NOT_NEEDED``; the tab then shows Chromium's error page at that URL)."""
    remote = [u for u in urls_to_open if not is_local_url(u)]
    if remote and not ctx.allow_network and ctx.task_id not in PAGES_NOT_NEEDED:
        raise SetupError(f"needs internet (web page): {remote[0]}")
    wait_for_chrome(ctx)

    def open_tabs(browser: Any) -> None:
        context = browser.contexts[0] if browser.contexts else browser.new_context()
        for url in urls_to_open:
            page = context.new_page()
            try:
                page.goto(url, timeout=30000)
            except Exception as exc:  # a slow page still counts as opened, as in OSWorld
                ctx.notes.append(f"chrome_open_tabs: {url}: {type(exc).__name__}")

    ctx.chrome.call(open_tabs, timeout_s=60)


def step_chrome_close_tabs(ctx: EpisodeContext, urls_to_close: list[str], **_: Any) -> None:
    """Close every tab whose URL starts with one of ``urls_to_close``."""
    wait_for_chrome(ctx)

    def close_tabs(browser: Any) -> None:
        for ctx_ in browser.contexts:
            for page in list(ctx_.pages):
                if any(page.url.startswith(u) for u in urls_to_close):
                    page.close()

    ctx.chrome.call(close_tabs, timeout_s=30)


STEPS: dict[str, Callable[..., None]] = {
    "execute": step_execute,
    "command": step_execute,
    "launch": step_launch,
    "open": step_open,
    "sleep": step_sleep,
    "activate_window": step_activate_window,
    "close_window": step_close_window,
    "download": step_download,
    "upload_file": step_upload_file,
    "chrome_open_tabs": step_chrome_open_tabs,
    "chrome_close_tabs": step_chrome_close_tabs,
    "update_browse_history": step_update_browse_history,
}


def run_steps(ctx: EpisodeContext, steps: list[SetupStep]) -> None:
    """Run steps in order; raises ``SetupError`` on the first that cannot run."""
    for i, step in enumerate(steps):
        fn = STEPS.get(step.type)
        if fn is None:
            raise SetupError(f"setup step not implemented: {step.type}")
        try:
            fn(ctx, **step.parameters)
        except SetupError:
            raise
        except TypeError as exc:
            raise SetupError(f"setup step {i} ({step.type}): bad parameters: {exc}") from exc
        except Exception as exc:
            raise SetupError(f"setup step {i} ({step.type}) failed: {type(exc).__name__}: {exc}") from exc
