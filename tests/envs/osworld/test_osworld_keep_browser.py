"""A kept browser (``DesktopEnv(keep_browser=True)``, ``chrome_keep.py``) comes back in the state of a
fresh start, field by field, after an episode that dirtied every field.

Everything is read back independently of the code under test: a raw DevTools client (its own
WebSocket) for tabs, windows, back/forward lists, open dialogs, cookies, origin storage (local and
session storage, IndexedDB, service workers, cache storage, the HTTP cache, permissions), the
settings UI's prefs; then, once the browser has closed and
flushed its profile, the profile's own files (History: URLs, visits, downloads) and the Downloads
folder. Real Chromium on the desktop's Xvfb, no mocks.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from typing import Any

import pytest

from rz_agents.envs.osworld.cdp import CdpClient, CdpError
from rz_agents.envs.osworld.chrome_keep import fresh_browser_reason, set_prefs
from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.providers.local import PROFILE_REL, sandbox_problem

pytest.importorskip("websockets.sync.client")  # CdpClient's transport

needs_desktop = pytest.mark.skipif(
    not (shutil.which("Xvfb") and shutil.which("chromium") and shutil.which("openbox")) or sandbox_problem(),
    reason="needs xvfb, chromium, openbox and bubblewrap (scripts/install.sh installs them)",
)

ORIGIN = "http://127.0.0.1:8000"
PAGES = {
    "index.html": "<title>Home</title><h1>Home</h1><a href='page2.html'>next</a>",
    "page2.html": "<title>Two</title><h1>Two</h1>",
    "page3.html": "<title>Three</title><h1>Three</h1>",
    "dialog.html": "<title>Dialog</title><script>setTimeout(() => alert('stay'), 200)</script>",
    "probe.html": "<title>Probe</title>",
    "sw.js": "self.addEventListener('fetch', () => {});",
    "data.txt": "cached bytes",
    "dl.bin": "downloaded bytes",
}
SITE = "/home/user/site"
TASK = {
    "id": "rz-keep-browser-check",
    "instruction": "Look at the local site.",
    "config": [
        {
            "type": "execute",
            "parameters": {
                "command": f"mkdir -p {SITE} && cd {SITE} && "
                + " && ".join(f"printf '%s' {json.dumps(body)} > {name}" for name, body in PAGES.items()),
                "shell": True,
            },
        },
        {
            "type": "launch",
            "parameters": {
                "command": ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "-d", SITE]
            },
        },
        {"type": "sleep", "parameters": {"seconds": 1}},
        {
            "type": "launch",
            "parameters": {
                "command": ["google-chrome", "--remote-debugging-port=1337", f"{ORIGIN}/index.html"]
            },
        },
    ],
    "evaluator": {"func": "infeasible"},
}
DIRTY_PREFS = {"webkit.webprefs.default_font_size": 22, "browser.show_home_button": True}


class Cdp(CdpClient):
    """The product's DevTools client (one WebSocket, flat sessions) with the test's two page helpers."""

    def page_targets(self) -> list[dict]:
        return [t for t in self.send("Target.getTargets")["targetInfos"] if t["type"] == "page"]

    def open_tab(self, url: str) -> tuple[str, str]:
        target = self.send("Target.createTarget", {"url": url})["targetId"]
        session = self.attach(target)
        deadline = time.monotonic() + 20
        while self.evaluate(session, "document.readyState") != "complete":
            assert time.monotonic() < deadline, url
            time.sleep(0.05)
        return target, session


def dirty(env: DesktopEnv) -> Cdp:
    """An episode that touches every field the reset must put back; returns the DevTools client
    that did it, still connected (its permission override ends when it disconnects)."""
    endpoint = env.ctx.chrome.endpoint
    home = env.provider.desktop.home_dir
    set_prefs(env.ctx.chrome.endpoint, DIRTY_PREFS)
    cdp = Cdp(endpoint)
    try:
        # a second window, whose tab stores everything an origin can store
        target = cdp.send("Target.createTarget", {"url": f"{ORIGIN}/index.html", "newWindow": True})[
            "targetId"
        ]
        session = cdp.attach(target)
        deadline = time.monotonic() + 20
        while cdp.evaluate(session, "document.readyState") != "complete":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        click = "const a = document.createElement('a'); a.href = 'dl.bin'; a.download = 'dl.bin';"
        cdp.evaluate(session, f"{click} document.body.appendChild(a); a.click(); true")
        downloads = os.path.join(home, "Downloads")
        deadline = time.monotonic() + 30
        while "dl.bin" not in os.listdir(downloads):
            assert time.monotonic() < deadline, os.listdir(downloads)
            time.sleep(0.1)
        cdp.evaluate(
            session,
            """(async () => {
                localStorage.setItem('k', 'v'); sessionStorage.setItem('k', 'v');
                document.cookie = 'k=v; max-age=99999';
                await new Promise(r => {
                    const q = indexedDB.open('rzdb', 1); q.onsuccess = r; q.onerror = r; });
                await navigator.serviceWorker.register('sw.js'); await navigator.serviceWorker.ready;
                await (await caches.open('rzcache')).put('/x', new Response('y'));
                await (await fetch('data.txt')).text();
                return true;
            })()""",
        )
        # a permission override, which lasts while this client stays connected (the caller closes it)
        grant = {"permission": {"name": "geolocation"}, "setting": "granted", "origin": ORIGIN}
        cdp.send("Browser.setPermission", grant)
        for page in ("page2.html", "page3.html"):  # a back/forward list of three
            cdp.send("Page.navigate", {"url": f"{ORIGIN}/{page}"}, session)
            deadline = time.monotonic() + 20
            probe = "location.href + document.readyState"
            while not str(cdp.evaluate(session, probe)).endswith(page + "complete"):
                assert time.monotonic() < deadline
                time.sleep(0.05)
    except BaseException:
        cdp.close()
        raise

    def dialog_tab(browser: Any) -> None:  # a listener keeps Playwright from dismissing the alert
        page = browser.contexts[0].new_page()
        page.on("dialog", lambda dialog: None)
        page.goto(f"{ORIGIN}/dialog.html")
        page.wait_for_timeout(600)

    env.ctx.chrome.call(dialog_tab)
    return cdp


def settings_session(cdp: Cdp) -> str:
    """A ``chrome://settings`` tab with the page's own scripts stopped (its WebUI bindings stay)."""
    target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = cdp.attach(target)
    cdp.send("Page.addScriptToEvaluateOnNewDocument", {"source": "window.stop()"}, session)
    cdp.send("Page.navigate", {"url": "chrome://settings/"}, session)
    deadline = time.monotonic() + 20
    while cdp.evaluate(session, "typeof chrome.send + typeof chrome.settingsPrivate") != "functionobject":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return session


SETTINGS_PROBE = "new Promise(r => chrome.settingsPrivate.getAllPrefs(r))"

ORIGIN_PROBE = """(async () => ({
    local_storage: localStorage.length,
    session_storage: sessionStorage.length,
    cookie_seen_by_page: document.cookie,
    indexeddb: (await indexedDB.databases()).map(d => d.name).sort(),
    service_workers: (await navigator.serviceWorker.getRegistrations()).length,
    cache_storage: (await caches.keys()).sort(),
    http_cache: await fetch('data.txt', {cache: 'only-if-cached', mode: 'same-origin'})
        .then(r => r.ok, () => false),
    geolocation_permission: (await navigator.permissions.query({name: 'geolocation'})).state,
}))()"""


def live_state(endpoint: str) -> dict[str, Any]:
    """Every field a running browser shows, read over DevTools (a probe tab opens last)."""
    cdp = Cdp(endpoint)
    try:
        state: dict[str, Any] = {}
        targets = cdp.page_targets()
        state["tabs"] = sorted(t["url"] for t in targets)
        windows, histories, dialogs = {}, [], 0
        for t in targets:
            info = cdp.send("Browser.getWindowForTarget", {"targetId": t["targetId"]})
            windows[info["windowId"]] = info["bounds"]
            session = cdp.attach(t["targetId"])
            nav = cdp.send("Page.getNavigationHistory", {}, session)
            histories.append([e["url"] for e in nav["entries"]])
            try:  # a page with an open alert answers nothing until it is closed
                cdp.evaluate(session, "1", timeout_s=3)
            except CdpError:  # no answer in time
                dialogs += 1
        state["windows"] = sorted(json.dumps(b, sort_keys=True) for b in windows.values())
        state["back_forward"] = sorted(histories)
        state["open_dialogs"] = dialogs
        state["cookies"] = sorted(
            (c["name"], c["domain"]) for c in cdp.send("Storage.getCookies").get("cookies", [])
        )
        _, session = cdp.open_tab(f"{ORIGIN}/probe.html")
        state.update(cdp.evaluate(session, ORIGIN_PROBE))
        for pref in cdp.evaluate(settings_session(cdp), SETTINGS_PROBE):
            if pref["key"] != "browser.clear_data.time_period":
                state[f"pref:{pref['key']}"] = pref.get("value")
        return state
    finally:
        cdp.close()


def profile_state(env: DesktopEnv) -> dict[str, Any]:
    """The profile's files once the browser has closed (Chromium flushes them on ``Browser.close``)."""
    provider = env.provider
    main = provider.browser_pids(helpers=False)
    cdp = Cdp(env.ctx.chrome.endpoint)
    try:
        cdp.send("Browser.close")
    except Exception:  # noqa: BLE001 - the socket may close before the answer
        pass
    deadline = time.monotonic() + 20
    while provider.browser_pids(helpers=False) & main:
        assert time.monotonic() < deadline, "the browser did not close"
        time.sleep(0.1)
    home = provider.desktop.home_dir
    history = os.path.join(home, PROFILE_REL, "Default", "History")
    db = sqlite3.connect(f"file:{history}?mode=ro", uri=True)
    try:
        state = {
            "history_urls": sorted(r[0] for r in db.execute("SELECT url FROM urls")),
            "history_visits": db.execute("SELECT count(*) FROM visits").fetchone()[0],
            "download_rows": db.execute("SELECT count(*) FROM downloads").fetchone()[0],
        }
    finally:
        db.close()
    state["downloads_folder"] = sorted(os.listdir(os.path.join(home, "Downloads")))
    return state


def _differ(a: dict, b: dict) -> dict[str, tuple]:
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


@needs_desktop
def test_kept_browser_comes_back_as_a_fresh_start_field_by_field():
    assert fresh_browser_reason([(s["type"], s["parameters"]) for s in TASK["config"]]) is None
    options = {"warm_reset": True}
    with DesktopEnv(require_screenshot=False, require_a11y_tree=False, provider_options=options) as fresh:
        fresh.reset(TASK)
        fresh_live = live_state(fresh.ctx.chrome.endpoint)
        fresh_files = profile_state(fresh)
        # the files' read-back sees a dirty episode (same desktop, its Chromium started afresh)
        fresh.reset(TASK)
        dirty(fresh).close()
        dirty_files = profile_state(fresh)
        for field in ("history_urls", "history_visits", "download_rows", "downloads_folder"):
            assert fresh_files[field] != dirty_files[field], field
    with DesktopEnv(require_screenshot=False, require_a11y_tree=False, keep_browser=True) as env:
        env.reset(TASK)
        assert not env.browser_kept
        browser = env.provider.browser_pids()
        dirty_client = dirty(env)
        dirty_live = live_state(env.ctx.chrome.endpoint)
        # the read-back sees every field dirty: a field it could not tell apart would prove nothing
        changed = _differ(fresh_live, dirty_live)
        for field in (
            "tabs", "windows", "back_forward", "open_dialogs", "cookies", "local_storage",
            "indexeddb", "service_workers", "cache_storage", "http_cache", "geolocation_permission",
            *(f"pref:{k}" for k in DIRTY_PREFS),
        ):  # fmt: skip
            assert field in changed, f"the dirty episode left {field} as a fresh start has it"

        env.reset(TASK)
        assert env.browser_kept, env.provider.browser_keep_failures
        assert env.provider.browser_pids() & browser, "the browser was restarted, not kept"
        kept_live = live_state(env.ctx.chrome.endpoint)
        assert _differ(fresh_live, kept_live) == {}
        dirty_client.close()
        kept_files = profile_state(env)
        assert _differ(fresh_files, kept_files) == {}
        assert fresh_files["history_urls"] == [f"{ORIGIN}/index.html", f"{ORIGIN}/probe.html"]


def _launch(*argv: str) -> tuple[str, dict]:
    return ("launch", {"command": list(argv)})


def test_fresh_browser_reason_decides_per_task():
    plain = _launch("google-chrome", "--remote-debugging-port=1337", "file:///home/user/a.html")
    assert fresh_browser_reason([("execute", {"command": "mkdir ~/site"}), plain]) is None
    assert fresh_browser_reason([plain, ("chrome_open_tabs", {"urls_to_open": ["x"]})]) is None
    reasons = {
        "update_browse_history": [("update_browse_history", {"history": []}), plain],
        "profile folder": [
            ("execute", {"command": "jq . ~/.config/google-chrome/Default/Preferences"}),
            plain,
        ],
        "own flags": [_launch("google-chrome", "--incognito", "--remote-debugging-port=1337")],
        "shell": [("launch", {"command": "google-chrome --remote-debugging-port=1337", "shell": True})],
        "before Chrome is launched": [("chrome_open_tabs", {"urls_to_open": ["x"]}), plain],
        "does not launch Chrome": [_launch("libreoffice", "--calc", "a.xlsx")],
    }
    for words, steps in reasons.items():
        assert words in (fresh_browser_reason(steps) or ""), (words, fresh_browser_reason(steps))


def test_warm_restore_leaves_the_kept_browser_paths_alone(tmp_path):
    from rz_agents.envs.osworld.providers import warm

    home, base = tmp_path / "home", tmp_path / "base"
    (base / ".config" / "app").mkdir(parents=True)
    (base / ".config" / "app" / "conf").write_text("fresh")
    (home / ".config" / "google-chrome").mkdir(parents=True)
    (home / ".config" / "google-chrome" / "History").write_text("kept")
    (home / ".config" / "app").mkdir()
    (home / ".config" / "app" / "conf").write_text("dirty")
    (home / "junk").write_text("x")
    baseline = warm.Baseline(set(), str(base))
    keep = (os.path.join(".config", "google-chrome"),)
    warm.restore_files(baseline, str(home), None, keep=keep)
    assert (home / ".config" / "google-chrome" / "History").read_text() == "kept"
    assert (home / ".config" / "app" / "conf").read_text() == "fresh" and not (home / "junk").exists()
    assert warm.same_tree(str(home), str(base), keep) is None
    assert warm.same_tree(str(home), str(base)) == "home differs at .config/google-chrome"
