"""Keep Chromium running across episodes and return it to a fresh start's state over DevTools.

A Chromium start is most of a desktop reset's CPU (~0.7-0.85 of ~1.1 CPU-s), so with
``DesktopEnv(keep_browser=True)`` the browser a chrome task started is kept for the next
chrome task, and cleaned instead of restarted:

1. every tab and window is closed (``/json/close``: no ``beforeunload`` handlers, open dialogs
   go with their tabs; a new tab is a new back/forward list), then a ``chrome://settings`` tab
   is opened with its own scripts stopped (its WebUI can clear browsing data and set prefs);
2. the settings page clears, for all time: history, the download list, cookies and site data
   (local storage, IndexedDB, service workers, cache storage, ...), the HTTP cache, site
   settings (permissions, zoom), hosted-app data and autofill form data -- the data types of
   Chromium's own "Clear browsing data" dialog;
3. every pref the settings UI exposes goes back to the fresh profile's value (read once from a
   freshly started browser: ``default_prefs``), and permission overrides are reset;
4. the settings tab closes: the browser runs with no window (it is started with
   ``--keep-alive-for-test``), as a desktop before the task's setup launches Chrome;
5. verified: no tab left, no cookie, every pref back. Any difference, an error, or a browser
   that died means a fresh start instead (the caller kills it and restores the profile).

The task's setup then runs as usual, except that its first Chrome launch opens the launch's
URLs in a new window of the kept browser (``open_window``), at the flags' position and size.
The downloaded files and everything else in the home folder are the warm reset's
(``providers/warm.py``), which leaves the profile folder to this module.

Which tasks keep the browser: ``fresh_browser_reason`` says why one needs a fresh start.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from typing import Any

from rz_agents.envs.osworld.cdp import CdpClient
from rz_agents.envs.osworld.chrome import CHROME_ALIASES

# Chromium's "Clear browsing data" dialog's data types (pref names, as its WebUI sends them).
# ``passwords`` is left out: this Chromium's handler aborts the renderer on it, and the episode's
# ``--password-store=basic`` has nothing a task could have saved that another task reads.
CLEAR_DATA_TYPES = (
    "browser.clear_data.browsing_history",
    "browser.clear_data.download_history",
    "browser.clear_data.cookies",
    "browser.clear_data.cache",
    "browser.clear_data.site_settings",
    "browser.clear_data.hosted_apps_data",
    "browser.clear_data.form_data",
)
ALL_TIME = 4  # the dialog's TimePeriod.ALL_TIME
SETTINGS_URL = "chrome://settings/clearBrowserData"
# Profile files a setup step may write before Chrome starts: such a task needs a fresh profile.
PROFILE_MARKERS = (".config/google-chrome", ".config/chromium")
# Preferences that are state, not settings: the clearing itself writes them.
VOLATILE_PREFS = frozenset({"browser.clear_data.time_period"})


class KeepError(RuntimeError):
    """The kept browser could not be verified clean; a fresh start replaces it."""


def chrome_launch_urls(step_type: str, params: dict[str, Any]) -> list[str] | None:
    """The URLs a ``launch`` step opens when it starts Chrome, else None (not a Chrome launch)."""
    if step_type != "launch":
        return None
    command = params.get("command")
    argv = command.split() if isinstance(command, str) else list(command or [])
    if not argv or os.path.basename(str(argv[0])) not in CHROME_ALIASES:
        return None
    return [str(a) for a in argv[1:] if not str(a).startswith("-")]


def fresh_browser_reason(steps: list[tuple[str, dict[str, Any]]]) -> str | None:
    """Why a task's setup needs a freshly started Chrome, or None when a kept one can serve it.

    ``steps``: the setup's ``(type, parameters)``. A kept browser serves a setup whose first
    Chrome launch is a plain ``launch`` (flags only the debugging port: every chrome and
    multi-app task in OSWorld), with nothing before it that needs Chrome absent.
    """
    for step_type, params in steps:
        text = json.dumps(params)
        if step_type == "update_browse_history":
            return "update_browse_history writes the History database before Chrome starts"
        if any(marker in text for marker in PROFILE_MARKERS):
            return f"a {step_type} step touches the Chrome profile folder"
        urls = chrome_launch_urls(step_type, params)
        if urls is not None:
            command = params.get("command")
            argv = command.split() if isinstance(command, str) else list(command)
            flags = [a for a in argv[1:] if str(a).startswith("-")]
            if any(not str(f).startswith("--remote-debugging-port") for f in flags):
                return f"Chrome is launched with its own flags {flags}"
            if params.get("shell"):
                return "Chrome is launched through a shell command"
            return None
        if step_type in ("chrome_open_tabs", "chrome_close_tabs"):
            return f"{step_type} before Chrome is launched (a fresh desktop has no Chrome to reach)"
    return "the setup does not launch Chrome (a kept browser would stay running)"


def close_tabs(endpoint: str, timeout_s: float = 10.0) -> None:
    """Close every tab and app window over DevTools' HTTP endpoint (``/json/close``).

    First, before any DevTools client attaches: a tab with an open ``alert`` answers nothing, so
    a client that initialises every tab it finds (Playwright) would wait on it. Closing takes no
    ``beforeunload`` handler; an open dialog goes with its tab."""
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(endpoint + "/json/list", timeout=5) as resp:
            left = [t for t in json.load(resp) if t.get("type") in ("page", "app")]
        if not left:
            return
        if time.monotonic() > deadline:
            raise KeepError(f"tabs still open after closing them: {[t.get('url') for t in left][:3]}")
        for target in left:
            try:
                urllib.request.urlopen(f"{endpoint}/json/close/{target['id']}", timeout=5).close()
            except OSError:
                pass  # gone already
        time.sleep(0.05)


def _settings_session(cdp: CdpClient) -> tuple[str, str]:
    """A ``chrome://settings`` tab whose own scripts never run: (target id, session).

    The settings UI (Polymer, every section) costs ~2 CPU-s to render; stopped before it parses
    (``window.stop()`` first thing in the document) the page still carries the WebUI's bindings
    (``chrome.send`` to the clear-browsing-data handler, ``chrome.settingsPrivate``) for ~0.3.
    """
    target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = cdp.attach(target)
    cdp.send("Page.addScriptToEvaluateOnNewDocument", {"source": "window.stop()"}, session)
    cdp.send("Page.navigate", {"url": SETTINGS_URL}, session)
    deadline = time.monotonic() + 15
    probe = "typeof chrome.send + typeof (chrome.settingsPrivate || {}).getAllPrefs"
    while cdp.evaluate(session, probe) != "functionfunction":
        if time.monotonic() > deadline:
            raise KeepError("the settings page did not come up")
        time.sleep(0.05)
    return target, session


def read_prefs(cdp: CdpClient, session: str) -> dict[str, Any]:
    """Every pref the settings UI exposes: ``{key: value}`` (through a ``_settings_session``)."""
    prefs = cdp.evaluate(session, "new Promise(r => chrome.settingsPrivate.getAllPrefs(r))")
    return {p["key"]: p.get("value") for p in prefs if p["key"] not in VOLATILE_PREFS}


def default_prefs(endpoint: str) -> dict[str, Any]:
    """The prefs of a browser that has just started on a fresh profile (before anyone used it)."""
    with CdpClient(endpoint) as cdp:
        target, session = _settings_session(cdp)
        try:
            return read_prefs(cdp, session)
        finally:
            cdp.send("Target.closeTarget", {"targetId": target})


def _set_pref(cdp: CdpClient, session: str, key: str, value: Any) -> None:
    cdp.evaluate(
        session,
        f"new Promise(r => chrome.settingsPrivate.setPref({json.dumps(key)}, {json.dumps(value)}, '', r))",
    )


def set_prefs(endpoint: str, values: dict[str, Any]) -> None:
    """Set prefs as the settings UI does (for tests that dirty a browser)."""
    with CdpClient(endpoint) as cdp:
        target, session = _settings_session(cdp)
        try:
            for key, value in values.items():
                _set_pref(cdp, session, key, value)
        finally:
            cdp.send("Target.closeTarget", {"targetId": target})


def _clear_browsing_data(cdp: CdpClient, session: str, timeout_s: float = 20.0) -> None:
    # The page's own scripts never ran, so the handler's answer (``cr.webUIResponse``) lands in ours.
    # ``initializeClearBrowsingData`` lets the handler call back into the page.
    types, wait_ms = json.dumps(list(CLEAR_DATA_TYPES)), int(timeout_s * 1000)
    ok = cdp.evaluate(
        session,
        "new Promise((resolve) => {"
        " window.cr = {webUIResponse: (id, ok) => { if (id === 'rz-clear') resolve(ok); },"
        " webUIListenerCallback: () => {}};"
        " chrome.send('initializeClearBrowsingData', ['rz-init']);"
        f" chrome.send('clearBrowsingData', ['rz-clear', {types}, {ALL_TIME}]);"
        f" setTimeout(() => resolve('timeout'), {wait_ms}); }})",
        timeout_s + 5,
    )
    if ok is not True:
        raise KeepError(f"clearing browsing data did not finish: {ok}")


def _restore_prefs(cdp: CdpClient, session: str, defaults: dict[str, Any]) -> list[str]:
    """Set back every pref that differs from ``defaults``; returns the keys still different."""
    now = read_prefs(cdp, session)
    changed = [k for k in defaults if k in now and now[k] != defaults[k]]
    for key in changed:
        _set_pref(cdp, session, key, defaults[key])
    after = read_prefs(cdp, session) if changed else now
    return sorted(k for k in set(defaults) | set(after) if after.get(k) != defaults.get(k))


def clean_browser(endpoint: str, defaults: dict[str, Any]) -> None:
    """Return the running browser to a fresh start's state (see the module doc); raises ``KeepError``
    with what stayed different."""
    close_tabs(endpoint)
    with CdpClient(endpoint) as cdp:
        target, session = _settings_session(cdp)
        _clear_browsing_data(cdp, session)
        cdp.send("Browser.resetPermissions")
        differ = _restore_prefs(cdp, session, defaults)
        if differ:
            raise KeepError(f"prefs not back to a fresh profile's: {differ[:5]}")
        cdp.send("Target.closeTarget", {"targetId": target})
        _wait_no_pages(cdp)
        cookies = cdp.send("Storage.getCookies").get("cookies", [])
        if cookies:
            raise KeepError(f"{len(cookies)} cookies left after clearing")


def _wait_no_pages(cdp: CdpClient, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        infos = cdp.send("Target.getTargets")["targetInfos"]
        left = [t["url"] for t in infos if t["type"] in ("page", "app")]
        if not left:
            return
        if time.monotonic() > deadline:
            raise KeepError(f"tabs still open after closing them: {left[:3]}")
        time.sleep(0.05)


def open_window(endpoint: str, urls: list[str], bounds: tuple[int, int, int, int]) -> None:
    """What ``google-chrome URL...`` opens in a fresh browser: one window at ``bounds`` (left, top,
    width, height) with a tab per URL (the new-tab page without one)."""
    left, top, width, height = bounds
    first, *rest = urls or ["chrome://newtab/"]
    with CdpClient(endpoint) as cdp:
        window = {"newWindow": True, "left": left, "top": top, "width": width, "height": height}
        cdp.send("Target.createTarget", {"url": first, **window})
        for url in rest:
            cdp.send("Target.createTarget", {"url": url})
