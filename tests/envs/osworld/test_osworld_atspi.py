"""The AT-SPI accessibility tree: each desktop's own session bus, accessibility switched on, the
tree read by a helper under the system Python, in OSWorld's XML form; the fallback tree stays."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET

import pytest
from osworld_markers import needs_atspi
from osworld_polling import until

from rz_agents.envs.osworld.a11y import COMPONENT_NS, STATE_NS, linearize
from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.setup_steps import step_launch

pytestmark = needs_atspi

PAGE = (
    "printf '<title>Shop</title><h1>Offers</h1><a href=\"x.html\">About us</a><button>Buy now</button>' "
    "> ~/shop.html"
)


def _until(fn, timeout_s=30.0):
    return until(fn, timeout_s, 0.5)


def test_chromium_page_widgets_appear_in_the_atspi_tree_with_states_and_geometry():
    with DesktopEnv(require_screenshot=False) as env:
        env.reset(None)
        env.ctx.client.execute(PAGE, shell=True)
        step_launch(env.ctx, ["google-chrome", "file:///home/user/shop.html"])
        xml = _until(lambda: (lambda x: x if "Buy now" in x else None)(env.ctx.client.accessibility_tree()))
        assert xml, "the page never showed up in the AT-SPI tree"
        root = ET.fromstring(xml)
        apps = [a.get("name") for a in root]
        assert root.tag == "desktop-frame" and "Chromium" in apps
        button = next(n for n in root.iter("push-button") if n.get("name") == "Buy now")
        assert (
            button.get(f"{{{STATE_NS}}}showing") == "true"
            and button.get(f"{{{STATE_NS}}}focusable") == "true"
        )
        assert button.get(f"{{{COMPONENT_NS}}}screencoord", "").startswith("(")
        lines = linearize(xml).split("\n")
        assert any(line.startswith("link\tAbout us\t") for line in lines)
        assert any(line.startswith("push-button\tBuy now\t") for line in lines)
        assert any(line.startswith("heading\tOffers\t") for line in lines)
        # each desktop has its own session bus and a11y bus: nothing of the host's
        bus = env.ctx.client.execute("echo $DBUS_SESSION_BUS_ADDRESS", shell=True)["output"]
        assert bus.startswith("unix:path=/run/user/1000/bus,")  # the VM user's path, in the sandbox's /run


def test_fallback_tree_when_atspi_is_switched_off():
    with DesktopEnv(require_screenshot=False, provider_options={"accessibility": "fallback"}) as env:
        env.reset(None)
        env.ctx.client.execute(PAGE, shell=True)
        step_launch(env.ctx, ["google-chrome", "file:///home/user/shop.html"])
        xml = _until(lambda: (lambda x: x if "Buy now" in x else None)(env.ctx.client.accessibility_tree()))
        assert (
            xml and f"{{{STATE_NS}}}" not in xml and 'name="Chromium"' in xml
        )  # X11 windows + CDP page tree


@pytest.mark.slow
@pytest.mark.skipif(
    not shutil.which("soffice"), reason="needs LibreOffice (scripts/install.sh --osworld-apps)"
)
def test_libreoffice_calc_exposes_cells_and_menus(tmp_path):
    """Slow (LibreOffice starts in ~10 s, the tree of a Calc window takes a few seconds): not in CI's default
    run."""
    with DesktopEnv(require_screenshot=False) as env:
        env.reset(None)
        code = (
            "import openpyxl; wb = openpyxl.Workbook(); ws = wb.active; ws.append(['Region', 'Sales']); "
            "ws.append(['North', 42]); wb.save('/home/user/sales.xlsx')"
        )
        env.ctx.client.execute(["python3", "-c", code])
        env.ctx.client.launch(["soffice", "--calc", "/home/user/sales.xlsx"])

        def complete(lines):  # the cells and the menus: a tree read while Calc still loads may hold only some
            wanted = ["table-cell\tA2\tNorth\t", "table-cell\tB2\t42\t"]
            wanted += [f"menu\t{menu}\t" for menu in ("File", "Edit", "Format", "Data")]
            return all(any(line.startswith(w) for line in lines) for w in wanted)

        seen: list[list[str]] = []

        def tree():
            lines = linearize(env.ctx.client.accessibility_tree()).split("\n")
            seen[:] = [lines]
            return lines if complete(lines) else None

        lines = _until(tree, 90)
        last = seen[0] if seen else []
        (tmp_path / "calc_tree.txt").write_text("\n".join(last))
        assert lines, f"Calc's cells and menus never all showed up; the last tree read: {last[:40]}"
