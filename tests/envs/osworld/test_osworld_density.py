"""Cheaper desktops keep what the agent sees: Chromium without its WebUI omnibox popups, and
screenshots encoded at a lower PNG compression level; and the tree holds still: tab names without
Chromium's live memory figure."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
import xml.etree.ElementTree as ET

import pytest
from osworld_markers import needs_atspi
from osworld_polling import until

from rz_agents.envs.osworld.a11y import linearize
from rz_agents.envs.osworld.chrome import LOCAL_STATE_DEFAULTS, write_chrome_wrapper
from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.setup_steps import step_launch

PAGE = (
    'printf \'<title>Shop</title><h1>Offers</h1><a href="x.html">About us</a>'
    "<button>Buy now</button>' > ~/shop.html"
)
OLD_FEATURES = "--disable-features=Translate,MediaRouter,OptimizationHints"  # before the WebUI popups went
MEMORY_IN_NAME = re.compile(r" - Memory usage - [0-9.]+ [KMG]B")
LOCAL_STATE = "~/.config/google-chrome/Local\\ State"


def _targets(env: DesktopEnv) -> list[dict]:
    port = env.provider.desktop.cdp_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as resp:
        return json.load(resp)


def _popup_frames(xml: str) -> list[ET.Element]:
    """The WebUI omnibox popups' frames in a tree (each a "showing" RoundedOmniboxResultsFrame)."""
    cls = "{https://accessibility.ubuntu.example.org/ns/attributes}class"
    return [
        f
        for f in ET.fromstring(xml).iter("frame")
        if any(p.get(cls) == "RoundedOmniboxResultsFrame" for p in f)
    ]


def _chrome_tree(env: DesktopEnv, extra: list[str], popups: int = 0) -> str:
    """The AT-SPI tree once Chromium (started with ``extra`` flags) shows the page, its ``popups``
    preloaded WebUI popups are up, and the tree holds still (a loaded machine makes all of it slow)."""
    step_launch(env.ctx, ["google-chrome", *extra, "file:///home/user/shop.html"])

    def up() -> bool:
        targets = _targets(env)
        shown = sum("omnibox-popup" in t["url"] for t in targets)
        return any(t.get("title") == "Shop" for t in targets) and shown == popups

    until(up, 60.0, 0.2)
    env.ctx.client.activate_window("Chromium")

    def settled() -> str | None:  # the same tree twice in a row (the page and the UI are done)
        a = env.ctx.client.accessibility_tree()
        b = env.ctx.client.accessibility_tree()
        done = "Buy now" in a and _normal(a) == _normal(b) and len(_popup_frames(a)) == popups
        return a if done else None

    return until(settled, 60.0, 0.5)


def _normal(xml: str) -> str:
    """The tree without the tab's live memory figure (Chromium names a tab "Shop - Memory usage - 22.1
    MB")."""
    return MEMORY_IN_NAME.sub("", xml)


def _stop_chrome(env: DesktopEnv) -> None:
    for pid in env.provider.pids():
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().startswith("chrom"):
                    os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    until(lambda: not env.ctx.client.windows(), 10.0, 0.1)


def _page_in_chrome(env: DesktopEnv, page: str = PAGE) -> str:
    """Reset ``env``, write ``page`` and open it in the wrapper's Chromium; the settled tree."""
    env.reset(None)
    env.ctx.client.execute(page, shell=True)
    return _chrome_tree(env, [])


@needs_atspi
def test_chromium_without_webui_omnibox_popups_gives_the_agent_the_same_tree():
    with DesktopEnv(require_screenshot=False) as env:
        new = _page_in_chrome(env)
        assert not [t["url"] for t in _targets(env) if "omnibox-popup" in t["url"]]
        _stop_chrome(env)
        env.ctx.client.execute("rm -rf ~/.config/google-chrome", shell=True)
        old = _chrome_tree(env, [OLD_FEATURES], popups=2)  # a later --disable-features replaces the wrapper's
        assert [t["url"] for t in _targets(env) if "omnibox-popup" in t["url"]], "control: popups preloaded"
        # what the agent reads (OSWorld's filtered, linearised tree) is the same
        assert linearize(_normal(new)) == linearize(_normal(old))
        # while the raw tree lost only the popups' phantom frames (showing, 0x0 documents inside)
        assert len(_popup_frames(old)) == 2 and _popup_frames(new) == []


@needs_atspi
def test_typing_in_the_address_bar_still_navigates_with_native_suggestions():
    with DesktopEnv(require_screenshot=False) as env:
        _page_in_chrome(env, PAGE + " && printf '<title>About</title>' > ~/about.html")
        code = (
            "pyautogui.hotkey('ctrl', 'l'); time.sleep(0.3);"
            " pyautogui.typewrite('file:///home/user/about.html', interval=0.005); pyautogui.press('enter')"
        )
        _, _, _, info = env.step(code, pause=0.0)
        assert not info.get("error"), info
        assert until(lambda: any(t.get("title") == "About" for t in _targets(env)), 20.0, 0.2)
        assert not [t["url"] for t in _targets(env) if "omnibox-popup" in t["url"]]  # the native popup served


@needs_atspi
def test_screenshots_at_the_fast_png_level_hold_the_same_pixels_as_the_default_level():
    from PIL import Image

    with DesktopEnv(require_a11y_tree=False) as env:
        _page_in_chrome(env)
        fast = env.ctx.client.screenshot()
        code = (  # the server's encoder at mss's default level, run in the same desktop
            "import base64, sys; from rz_agents.envs.osworld.server import screenshot_png;"
            " sys.stdout.write(base64.b64encode(screenshot_png(level=6)).decode())"
        )
        default = base64.b64decode(env.ctx.client.execute(["python3", "-c", code])["output"])
        fast_img, default_img = (Image.open(io.BytesIO(b)) for b in (fast, default))
        assert fast_img.size == default_img.size == (1920, 1080) and fast_img.mode == default_img.mode
        assert len(fast_img.getcolors(1 << 20) or range(2)) > 1  # a page on screen, not a blank frame
        assert fast_img.tobytes() == default_img.tobytes()
        assert fast != default  # control: the encodings differ, the pixels do not


TEXT_CHECK = """
import pyatspi
def walk(acc, out):
    try:
        t = acc.queryText()
        out.append((t.getText(0, t.characterCount), t.getText(0, -1)))
    except NotImplementedError:
        pass
    for i in range(acc.childCount):
        child = acc.getChildAtIndex(i)
        if child is not None:
            walk(child, out)
    return out
pairs = walk(pyatspi.Registry.getDesktop(0), [])
print(len(pairs), sum(a == b for a, b in pairs), sum(bool(a) for a, _ in pairs))
"""


@needs_atspi
def test_text_to_the_end_in_one_call_equals_text_up_to_the_character_count():
    with DesktopEnv(require_screenshot=False) as env:
        _page_in_chrome(env)
        out = env.ctx.client.execute(["/usr/bin/python3", "-c", TEXT_CHECK])
        nodes, equal, with_text = (int(x) for x in out["output"].split())
        assert nodes > 50 and with_text > 5, out  # Chromium's widgets and the page's text were read
        assert equal == nodes


needs_desktop = pytest.mark.skipif(
    not shutil.which("Xvfb"), reason="needs xvfb (scripts/install.sh installs it)"
)


@needs_desktop
def test_mouseinfo_comes_preloaded_and_each_action_that_uses_it_opens_its_own_display():
    with DesktopEnv(require_screenshot=False, require_a11y_tree=False) as env:
        env.reset(None)
        probe = (
            "import mouseinfo\n"
            "print(type(mouseinfo._display).__name__, mouseinfo._display.__dict__['_display'] is None)\n"
            "pyautogui.moveTo({x}, 400)\n"
            "print(mouseinfo.position() == tuple(pyautogui.position()) == ({x}, 400))\n"
        )
        for x in (300, 500):  # twice: the first child's connection is not the next one's
            out = env.ctx.client.run_python(probe.format(x=x))
            assert out["returncode"] == 0, out
            # preloaded (no `which scrot` and no display per action), not yet connected, then works
            assert out["output"].split() == ["_DeferredDisplay", "True", "True"], out


def test_the_wrapper_turns_the_memory_line_off_in_a_new_profile_and_keeps_an_existing_local_state(tmp_path):
    argv_file = tmp_path / "argv"
    fake = tmp_path / "chromium"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {argv_file}\n')
    fake.chmod(0o755)
    profile = tmp_path / "home" / ".config" / "google-chrome"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = write_chrome_wrapper(str(bin_dir), str(fake), 9333, str(profile))
    subprocess.run([wrapper, "--remote-debugging-port=1337", "about:blank"], check=True, timeout=10)
    assert json.loads((profile / "Local State").read_text()) == LOCAL_STATE_DEFAULTS
    # the task's port dropped, as before
    assert "--remote-debugging-port=9333" in argv_file.read_text().split()
    kept = {"browser": {"enabled_labs_experiments": ["x@1"]}}  # e.g. written by Chromium on an earlier start
    (profile / "Local State").write_text(json.dumps(kept))
    subprocess.run([wrapper], check=True, timeout=10)
    assert json.loads((profile / "Local State").read_text()) == kept


@needs_atspi
def test_tab_names_carry_no_live_memory_figure_where_the_hover_card_pref_would_add_one():
    def names_until(env: DesktopEnv, stop, timeout_s: float) -> set[str]:
        seen: set[str] = set()

        def look() -> bool:
            seen.update(re.findall(r'name="(Shop[^"]*)"', env.ctx.client.accessibility_tree()))
            return stop(seen)

        until(look, timeout_s, 1.0)
        return seen

    with DesktopEnv(require_screenshot=False) as env:
        env.reset(None)
        on = json.dumps({"browser": {"hovercard": {"memory_usage_enabled": True}}})
        env.ctx.client.execute(
            f"{PAGE} && mkdir -p ~/.config/google-chrome && echo '{on}' > {LOCAL_STATE}", shell=True
        )
        _chrome_tree(env, [])
        start = time.monotonic()
        control = names_until(env, lambda seen: any(MEMORY_IN_NAME.search(n) for n in seen), 90.0)
        shown_after = time.monotonic() - start
        assert any(MEMORY_IN_NAME.search(n) for n in control), (
            f"control: the pref on shows the figure ({control})"
        )
        _stop_chrome(env)
        env.ctx.client.execute("rm -rf ~/.config/google-chrome", shell=True)
        _chrome_tree(env, [])  # the wrapper's own Local State
        default = names_until(env, lambda seen: False, max(3 * shown_after, 15.0))
        assert "Shop" in default and not any(MEMORY_IN_NAME.search(n) for n in default), default


@needs_desktop
def test_xlib_extension_modules_come_preloaded_and_actions_still_open_their_own_display():
    with DesktopEnv(require_screenshot=False, require_a11y_tree=False) as env:
        env.reset(None)
        # ``python -c`` is answered by the runner's fork: what it preloaded is there before any import
        probe = "import sys; print(sorted(m for m in sys.modules if m.startswith('Xlib.ext.')))"
        out = env.ctx.client.execute(["python", "-c", probe])
        assert out["returncode"] == 0, out
        assert {"Xlib.ext.xtest", "Xlib.ext.randr", "Xlib.ext.xinput"} <= set(eval(out["output"])), out
        for x in (250, 450):  # each action's pyautogui still works on a display of its own
            moved = env.ctx.client.run_python(
                f"pyautogui.moveTo({x}, 300)\nprint(tuple(pyautogui.position()))"
            )
            assert moved["returncode"] == 0 and moved["output"].strip() == f"({x}, 300)", moved
