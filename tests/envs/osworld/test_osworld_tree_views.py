"""The tree the agent reads, cheaply: the ``agent`` view (only the nodes OSWorld's text agent keeps,
found in Chromium by one Collection search and pipelined D-Bus calls instead of a walk) gives the
same table as the full tree while the page and the browser change under it, and as a walk that
looks for the same nodes."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET

import pytest
from osworld_markers import needs_atspi
from osworld_polling import until

from rz_agents.envs.osworld.a11y import linearize
from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.setup_steps import step_launch

SITE = (
    "mkdir -p ~/site && cd ~/site && "
    'printf \'<title>Home</title><h1>Welcome</h1><a href="about.html">About us</a> '
    '<button disabled>Sold out</button><input aria-label="Search">'
    '<div style="height:1500px"></div><a href="#end" id="end">Bottom link</a>\' > index.html && '
    "printf '<title>About</title><h1>About this site</h1><ul><li>One</li><li>Two</li></ul>' > about.html"
)

# Actions that change names, states, children and geometry: hover, focus and type, navigate and
# come back, scroll, open and close a tab, open and close the browser menu.
ACTIONS = [
    "pyautogui.moveTo(40, 160)",
    "pyautogui.click(40, 160)",
    "pyautogui.hotkey('alt', 'left')",
    "pyautogui.click(60, 110); pyautogui.press('tab'); pyautogui.press('tab'); pyautogui.typewrite('shoes')",
    "pyautogui.moveTo(900, 600); pyautogui.scroll(-20)",
    "pyautogui.hotkey('ctrl', 't')",
    "pyautogui.hotkey('ctrl', 'w')",
    "pyautogui.hotkey('alt', 'f')",
    "pyautogui.press('escape')",
]


def _site_in_chrome(env: DesktopEnv) -> None:
    """Reset ``env`` and open the test site in the wrapper's Chromium, until its page is in the tree."""
    env.reset(None)
    env.ctx.client.execute(SITE, shell=True)
    step_launch(env.ctx, ["google-chrome", "file:///home/user/site/index.html"])
    until(lambda: "Welcome" in linearize(env.ctx.client.accessibility_tree("full")), 60.0, 0.5)


def _settled_table(env: DesktopEnv) -> str | None:
    """The full tree's table, once two reads in a row agree (a page still loading changes)."""
    a = linearize(env.ctx.client.accessibility_tree("full"))
    return a if a == linearize(env.ctx.client.accessibility_tree("full")) else None


def _views_agree(env: DesktopEnv) -> tuple[str, str] | None:
    """(full tree's table, agent view's XML) when the agent view, searched and walked, gives the
    settled full tree's table, which is still the same after; None otherwise."""
    ref = until(lambda: _settled_table(env), 30.0, 0.3)
    agent = env.ctx.client.accessibility_tree("agent")
    walked = env.ctx.client.accessibility_tree("agent", collect=False)
    after = linearize(env.ctx.client.accessibility_tree("full"))
    assert ET.fromstring(walked).get("searched") == "0"
    return (ref, agent) if ref == after == linearize(agent) == linearize(walked) else None


@needs_atspi
def test_agent_view_gives_the_full_trees_table_as_the_browser_changes():
    with DesktopEnv(require_screenshot=False) as env:
        _site_in_chrome(env)
        env.ctx.client.activate_window("Chromium")
        seen = set()
        for action in ACTIONS:
            _, _, info = env.step(action, pause=0.5)[1:]
            assert not info.get("error"), (action, info)
            agreed = None
            for _ in range(5):  # a page still loading changes between reads: try again
                agreed = _views_agree(env)
                if agreed:
                    break
                time.sleep(1.0)
            assert agreed, f"after {action!r} the agent view never gave the full tree's table"
            ref, agent = agreed
            assert ET.fromstring(agent).get("searched") == "1", "Chromium was walked, not searched"
            # the agent view holds only the kept nodes, flat: one row each
            rows = ref.split("\n")[1:]
            assert len(ET.fromstring(agent)) == len(rows), action
            seen.update(rows)
        names = {row.split("\t")[1] for row in seen}
        # the walk saw the pages, the typed text and the browser's menu; the disabled button never
        assert {"Welcome", "About us", "About this site", "Bottom link"} <= names, names
        assert any("shoes" in row for row in seen) and any(row.startswith("menu-item\t") for row in seen)
        assert "Sold out" not in names


@needs_atspi
def test_the_agent_view_is_chosen_by_the_rl_env_and_refused_when_unknown():
    with DesktopEnv(require_screenshot=False, a11y_view="agent") as env:
        env.reset(None)
        url = env.provider.desktop.server_url
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{url}/accessibility?view=everything", timeout=10)
        assert err.value.code == 400
        assert ET.fromstring(env._get_obs()["accessibility_tree"]).tag == "desktop-frame"
    with pytest.raises(ValueError, match="a11y_view"):
        DesktopEnv(a11y_view="everything")
    from rz_agents.envs.osworld.gym_env import OSWorldEnv

    env = OSWorldEnv(tasks_path="local")
    try:
        assert env.desktop.a11y_view == "agent"
    finally:
        env.close()


@needs_atspi
@pytest.mark.skipif(not shutil.which("gnome-terminal"), reason="needs gnome-terminal (scripts/install.sh)")
def test_agent_view_of_a_gtk_terminal_is_walked_and_follows_typed_text():
    with DesktopEnv(require_screenshot=False) as env:
        env.reset(None)
        env.step("pyautogui.hotkey('ctrl', 'alt', 't')", pause=1.0)
        until(lambda: "terminal\t" in linearize(env.ctx.client.accessibility_tree("full")), 60.0, 0.5)
        for action in ("pyautogui.typewrite('echo agent-view-check')", "pyautogui.press('enter')"):
            env.step(action, pause=0.5)
            agreed = None
            for _ in range(5):
                agreed = _views_agree(env)
                if agreed:
                    break
                time.sleep(1.0)
            assert agreed, f"after {action!r} the agent view never gave the full tree's table"
        assert "agent-view-check" in linearize(agreed[1])
        assert ET.fromstring(agreed[1]).get("searched") == "0"  # a GTK application is walked


HELPER = "/opt/rz/rz_agents/envs/osworld/atspi_tree.py"


def _helper_answers(env: DesktopEnv, requests: list[dict]) -> list[str]:
    """The desktop's tree helper run once on ``requests`` (one answer's XML each)."""
    lines = "\n".join(json.dumps(r) for r in requests)
    out = env.ctx.client.execute(f"printf '%s\\n' '{lines}' | /usr/bin/python3 {HELPER}", shell=True)
    answers = [json.loads(line) for line in out["output"].splitlines()[1:]]  # after {"ready": true}
    assert len(answers) == len(requests) and all("xml" in a for a in answers), out
    return [a["xml"] for a in answers]


@needs_atspi
def test_search_and_walk_agree_at_every_depth_limit_and_without_pruning():
    # the search checks each match's ancestors the way the walk descends: depth and hidden parents
    with DesktopEnv(require_screenshot=False) as env:
        _site_in_chrome(env)
        env.step("pyautogui.hotkey('alt', 'f')", pause=1.0)  # a menu open: more depth, hidden items
        limits = [{"max_depth": d} for d in (3, 6, 9, 12, 15, 60)] + [{"prune_hidden": False}]
        for _ in range(5):  # the menu and the page may still change between the two runs
            searched = _helper_answers(env, [{"view": "agent", **lim} for lim in limits])
            walked = _helper_answers(env, [{"view": "agent", "collect": False, **lim} for lim in limits])
            if [linearize(x) for x in searched] == [linearize(x) for x in walked]:
                break
            time.sleep(1.0)
        assert [linearize(x) for x in searched] == [linearize(x) for x in walked]
        rows = [len(linearize(x).split("\n")) for x in searched]
        assert rows[0] < rows[2] <= rows[5], rows  # the depth limit does cut the table
        assert all(ET.fromstring(x).get("searched") == "1" for x in searched)
