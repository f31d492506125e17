"""Chromium for ``google-chrome`` tasks: the launch command, a wrapper script, and a CDP link.

The network is closed, so the browser runs with background networking, sync, component updates
and QUIC off. Each episode gets its own profile (``~/.config/google-chrome`` in the episode home,
where OSWorld's getters look for ``Preferences``/``Bookmarks``) and its own remote-debugging port.

``ChromeLink`` drives the browser through Playwright's ``connect_over_cdp`` (never launching or
downloading a Playwright browser). Playwright's sync API is bound to the thread that started it,
so one worker thread owns the connection and every call is shipped to it.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
from collections.abc import Callable
from typing import Any

CHROME_ALIASES = ("google-chrome", "google-chrome-stable", "chrome", "chromium", "chromium-browser")
WEBUI_OMNIBOX_FEATURES = ("WebUIOmniboxPopup", "WebUIOmniboxFullPopup", "WebUIOmniboxAimPopup")
CHROMIUM_FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    # The WebUI omnibox popups (Chromium >= 13x) are two renderers preloaded at every start: about
    # half of a start's CPU (0.7-0.9 of 1.5-1.8 CPU-s measured, bench/osworld.py --profile) and two
    # phantom "showing" frames in the AT-SPI tree. Off, the address bar's suggestions are native
    # views again (as in OSWorld's VM-era Chrome); the linearised tree an agent reads is unchanged.
    "--disable-features=Translate,MediaRouter,OptimizationHints," + ",".join(WEBUI_OMNIBOX_FEATURES),
    "--password-store=basic",
    "--test-type",  # hides the "unsupported command-line flag" infobar that --no-sandbox brings
    "--window-position=0,0",
    "--window-size=1920,1080",
)


# Written as the profile's ``Local State`` when it has none, before Chromium starts. Chromium >= 15x names
# a tab "<title> - Memory usage - 22.4 MB" in its accessibility tree once its resource sampler has run
# (seconds after the page loads), so the tree an agent reads changed from step to step and differed from
# OSWorld's; the hover card's memory line (this local-state pref) is what puts the figure in the name.
LOCAL_STATE_DEFAULTS = {"browser": {"hovercard": {"memory_usage_enabled": False}}}


def chromium_binary() -> str | None:
    """The Chromium executable on this machine, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def chromium_command(
    binary: str, cdp_port: int, profile_dir: str, extra: list[str] | None = None
) -> list[str]:
    """The full Chromium argv for one episode (the caller's own debugging-port flags dropped)."""
    args = [a for a in (extra or []) if not a.startswith(("--remote-debugging-port", "--user-data-dir"))]
    return [
        binary,
        *CHROMIUM_FLAGS,
        f"--remote-debugging-port={cdp_port}",
        "--remote-debugging-address=127.0.0.1",
        f"--user-data-dir={profile_dir}",
        *args,
    ]


def write_chrome_wrapper(
    bin_dir: str, binary: str, cdp_port: int, profile_dir: str, extra_flags: list[str] | None = None
) -> str:
    """Write a ``google-chrome`` shell wrapper into ``bin_dir`` (and its aliases); returns its path.

    Tasks launch ``google-chrome --remote-debugging-port=1337``; the wrapper drops the task's port
    and profile flags and starts Chromium with the episode's own, so any way of starting Chrome
    (setup step, agent code, a shell) lands on the same CDP port. A profile without ``Local State``
    gets ``LOCAL_STATE_DEFAULTS`` first (one that has it, e.g. from an earlier start, is left as is).
    """
    flags = " ".join(f"'{f}'" for f in chromium_command(binary, cdp_port, profile_dir, extra_flags)[1:])
    state = os.path.join(profile_dir, "Local State")
    script = (
        "#!/bin/sh\n"
        "# Generated per episode by rz_agents.envs.osworld: Chromium with this episode's CDP port.\n"
        'for a do shift; case "$a" in --remote-debugging-port=*|--remote-debugging-address=*|'
        '--user-data-dir=*) ;; *) set -- "$@" "$a";; esac; done\n'
        f"[ -e '{state}' ] || {{ mkdir -p '{profile_dir}' && "
        f"printf '%s' '{json.dumps(LOCAL_STATE_DEFAULTS)}' > '{state}'; }}\n"
        f'exec "{binary}" {flags} "$@"\n'
    )
    path = os.path.join(bin_dir, "google-chrome")
    with open(path, "w") as f:
        f.write(script)
    os.chmod(path, 0o755)
    for alias in CHROME_ALIASES[1:]:
        alias_path = os.path.join(bin_dir, alias)
        if not os.path.exists(alias_path):
            os.symlink(path, alias_path)
    return path


class ChromeLink:
    """A Playwright CDP connection to one Chromium, owned by a dedicated worker thread.

    The driver outlives episodes: ``retarget`` moves the link to the next browser, saving the
    driver's start-up on every reset.
    """

    def __init__(self, cdp_port: int, connect_timeout_s: float = 10.0) -> None:
        self.endpoint = f"http://127.0.0.1:{cdp_port}"
        self.connect_timeout_s = connect_timeout_s
        self.generation = 0  # bumped by retarget: the next call connects afresh, even on the same port
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _worker(self) -> None:
        os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
        from playwright.sync_api import sync_playwright

        pw = sync_playwright().start()
        browser = None
        connected_to = ("", -1)
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    break
                fn, box, done, connect = job
                try:
                    if browser is not None and (
                        connected_to != (self.endpoint, self.generation)
                        or not browser.is_connected()
                        or self._stale(browser)
                    ):
                        _disconnect(browser)
                        browser = None
                    if browser is None and connect:
                        connected_to = (self.endpoint, self.generation)
                        browser = pw.chromium.connect_over_cdp(
                            connected_to[0], timeout=self.connect_timeout_s * 1000
                        )
                        _default_downloads(browser)
                    box.append(("ok", fn(browser)))
                except Exception as exc:  # shipped back to the caller's thread
                    browser = None if browser is not None and not browser.is_connected() else browser
                    box.append(("err", exc))
                done.set()
        finally:
            if browser is not None:
                _disconnect(browser)
            pw.stop()

    def _stale(self, browser: Any) -> bool:
        """True when Chrome has tabs Playwright has not seen yet (or the reverse).

        Playwright learns of tabs opened by the user (Ctrl+T, links) through events it only
        processes during later calls, so a long-lived connection can miss them; Chrome's
        ``/json/list`` is the truth, and a mismatch means reconnecting (as OSWorld's getters,
        which connect afresh every time).
        """
        import json
        import urllib.request

        try:
            with urllib.request.urlopen(self.endpoint + "/json/list", timeout=2) as resp:
                targets = json.load(resp)
        except (OSError, ValueError):
            return True
        return sum(t.get("type") == "page" for t in targets) != len(pages(browser))

    def retarget(self, cdp_port: int) -> None:
        """Point the link at the next episode's browser (a desktop reset in place keeps its port, but
        its Chromium is new); Playwright's driver is kept."""
        self.endpoint = f"http://127.0.0.1:{cdp_port}"
        self.generation += 1

    def release(self, timeout_s: float = 10.0) -> None:
        """Drop Playwright's connection now (the next ``call`` connects afresh); the driver is kept.

        Connected, Playwright attaches to every tab the browser opens and follows its events: a kept
        browser's cleaning (``chrome_keep.py``) opens and closes tabs that nobody needs it to watch."""
        self.generation += 1
        if self._thread is not None:
            self.call(lambda browser: None, timeout_s, connect=False)

    def call(self, fn: Callable[[Any], Any], timeout_s: float = 30.0, connect: bool = True) -> Any:
        """Run ``fn(browser)`` on the worker thread and return its result (or raise its error)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._worker, name="chrome-link", daemon=True)
                self._thread.start()
        box: list = []
        done = threading.Event()
        self._jobs.put((fn, box, done, connect))
        if not done.wait(timeout_s):
            raise TimeoutError(f"Chrome (CDP {self.endpoint}) did not answer within {timeout_s:.0f}s")
        status, value = box[0]
        if status == "err":
            raise value
        return value

    def close(self) -> None:
        """Stop the worker (and Playwright's driver process); safe to call twice."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join(timeout=10)


def _default_downloads(browser: Any) -> None:
    """Downloads back to Chrome's own folder (``~/Downloads``, as in OSWorld's VM).

    Connecting over CDP, Playwright routes the default context's downloads into its own
    artifacts folder on the host (``allowAndName``), which the sandboxed browser cannot write:
    a file the agent downloads would never reach the desktop."""
    session = browser.new_browser_cdp_session()
    try:
        session.send("Browser.setDownloadBehavior", {"behavior": "default"})
    finally:
        session.detach()


def _disconnect(browser: Any) -> None:
    try:
        browser.close()  # over CDP this only disconnects; the browser keeps running
    except Exception:
        pass


def pages(browser: Any) -> list[Any]:
    """Every open page (tab) of the browser, in context order."""
    return [p for ctx in browser.contexts for p in ctx.pages if not p.is_closed()]


def active_page(browser: Any) -> Any | None:
    """The tab the user sees: the visible one (``document.visibilityState``), else the last."""
    all_pages = pages(browser)
    for page in reversed(all_pages):
        try:
            if page.evaluate("document.visibilityState") == "visible":
                return page
        except Exception:
            continue
    return all_pages[-1] if all_pages else None


_SKIP_ROLES = {"none", "generic", "InlineTextBox", "LineBreak", "presentation"}


def page_ax_nodes(page: Any, max_nodes: int = 300) -> list[dict[str, Any]]:
    """The page's accessibility tree as flat nodes ``{role, name, value, x, y, w, h}`` in screen pixels.

    Positions come from ``DOM.getBoxModel`` plus the viewport's offset on screen, so coordinates
    can be clicked with pyautogui directly.
    """
    session = page.context.new_cdp_session(page)
    try:
        tree = session.send("Accessibility.getFullAXTree")
        offset = page.evaluate(
            "[window.screenX + (window.outerWidth - window.innerWidth),"
            " window.screenY + (window.outerHeight - window.innerHeight)]"
        )
        out = []
        for node in tree.get("nodes", []):
            if node.get("ignored"):
                continue
            role = (node.get("role") or {}).get("value", "")
            name = str((node.get("name") or {}).get("value", "") or "")
            value = str((node.get("value") or {}).get("value", "") or "")
            if role in _SKIP_ROLES or (role == "StaticText" and not name.strip()):
                continue
            item = {"role": role, "name": name, "value": value, "x": -1, "y": -1, "w": 0, "h": 0}
            backend = node.get("backendDOMNodeId")
            if backend is not None and role not in ("RootWebArea", "StaticText"):
                try:
                    quad = session.send("DOM.getBoxModel", {"backendNodeId": backend})["model"]["border"]
                    xs, ys = quad[0::2], quad[1::2]
                    item.update(
                        x=int(min(xs) + offset[0]),
                        y=int(min(ys) + offset[1]),
                        w=int(max(xs) - min(xs)),
                        h=int(max(ys) - min(ys)),
                    )
                except Exception:
                    pass  # nodes without a layout box (hidden, text-only) keep no position
            out.append(item)
            if len(out) >= max_nodes:
                break
        return out
    finally:
        try:
            session.detach()
        except Exception:
            pass
