"""VS Code tasks on code-server: the desktop's ``code`` installs a .vsix and lists extensions in
``~/.vscode/extensions``, opens VS Code's workbench in a window, runs an extension's command from
the palette (the ``vscode_config`` getter) and writes ``~/.config/Code/User/settings.json``."""

from __future__ import annotations

import io
import json
import shutil
import time
import zipfile

import pytest
from osworld_polling import until

from rz_agents.envs.osworld.vscode import vscode_problem

pytestmark = pytest.mark.skipif(
    vscode_problem() is not None or not shutil.which("Xvfb"),
    reason=f"needs code-server and xvfb ({vscode_problem()}; scripts/install.sh --osworld-apps)",
)

EXTENSION_JS = """
const vscode = require('vscode');
const fs = require('fs');
const os = require('os');
exports.activate = (context) => {
  context.subscriptions.push(vscode.commands.registerCommand('rzTest.writeMarker', () => {
    fs.writeFileSync(os.homedir() + '/marker.txt', 'written by the extension');
  }));
};
"""


def _vsix() -> bytes:
    """A minimal extension package: one command that writes ~/marker.txt."""
    manifest = {
        "name": "marker", "publisher": "rzpub", "version": "0.0.1", "engines": {"vscode": "^1.60.0"},
        "main": "./extension.js", "activationEvents": ["onCommand:rzTest.writeMarker"],
        "contributes": {"commands": [{"command": "rzTest.writeMarker", "title": "RZ Write Marker"}]},
    }  # fmt: skip
    vsixmanifest = (
        '<?xml version="1.0" encoding="utf-8"?><PackageManifest Version="2.0.0" '
        'xmlns="http://schemas.microsoft.com/developer/vsx-schema/2011"><Metadata>'
        '<Identity Language="en-US" Id="marker" Version="0.0.1" Publisher="rzpub"/>'
        "<DisplayName>marker</DisplayName><Description>test</Description></Metadata>"
        '<Installation><InstallationTarget Id="Microsoft.VisualStudio.Code"/></Installation>'
        '<Assets><Asset Type="Microsoft.VisualStudio.Code.Manifest" Path="extension/package.json" '
        'Addressable="true"/>'
        "</Assets></PackageManifest>"
    )
    types = (
        '<?xml version="1.0" encoding="utf-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="json" ContentType="application/json"/><Default Extension="js" '
        'ContentType="application/javascript"/><Default Extension="vsixmanifest" ContentType="text/xml"/>'
        '</Types>'
    )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("[Content_Types].xml", types)
        z.writestr("extension.vsixmanifest", vsixmanifest)
        z.writestr("extension/package.json", json.dumps(manifest))
        z.writestr("extension/extension.js", EXTENSION_JS)
    return buf.getvalue()


def _until(fn, timeout_s=60.0):
    return until(fn, timeout_s, 0.5)


def _palette(env, command: str) -> None:
    env.ctx.client.run_python(
        f"pyautogui.hotkey('ctrl', 'shift', 'p'); time.sleep(1.5); pyautogui.typewrite({command!r});"
        " time.sleep(1.5); pyautogui.press('enter'); time.sleep(1.5)"
    )


def test_code_installs_a_vsix_opens_the_workbench_and_its_settings_land_where_vs_code_keeps_them(tmp_path):
    from rz_agents.envs.osworld.desktop_env import DesktopEnv
    from rz_agents.envs.osworld.getters import get_state
    from rz_agents.envs.osworld.metrics import METRICS
    from rz_agents.envs.osworld.providers.local import episode_pids

    with DesktopEnv(require_screenshot=False, require_a11y_tree=False) as env:
        env.reset(None)
        env.ctx.work_dir = str(tmp_path)
        client = env.ctx.client
        client.upload("/home/user/marker.vsix", _vsix())
        assert client.execute(["code", "--install-extension", "/home/user/marker.vsix"])["returncode"] == 0
        listed = get_state(env.ctx, {"type": "vm_command_line", "command": ["code", "--list-extensions"]})
        assert "rzpub.marker" in listed
        assert (
            METRICS["is_extension_installed"](listed, {"type": "contain", "expected": "rzpub.marker"}) == 1.0
        )
        assert client.list_directory("/home/user/.vscode/extensions") is not None

        client.execute(
            "mkdir -p /home/user/project && printf 'x = 1\\n' > /home/user/project/a.py", shell=True
        )
        client.launch(["code", "/home/user/project/a.py"], shell=False)
        titles = _until(
            lambda: [w["name"] for w in client.windows() if w["class"] == "Code" and "a.py" in w["name"]]
        )
        assert titles and titles[0].startswith("a.py - project")  # the file opened in its folder's window
        time.sleep(3)  # the extension host starts after the window

        marker = get_state(
            env.ctx,
            {"type": "vscode_config", "vscode_extension_command": "RZ Write Marker",
             "path": "/home/user/marker.txt", "dest": "m.txt"},
        )  # fmt: skip
        if marker is None:  # a slow extension host: the palette again, as an agent would
            _palette(env, "RZ Write Marker")
            marker = _until(
                lambda: get_state(
                    env.ctx, {"type": "vm_file", "path": "/home/user/marker.txt", "dest": "m.txt"}
                ),
                20,
            )
        assert marker and open(marker).read() == "written by the extension"

        client.run_python("time.sleep(1); pyautogui.press('escape'); time.sleep(0.5)")
        _palette(env, "View: Toggle Minimap")  # VS Code keeps the choice as a user setting
        rules = {"expected": {"editor.minimap.enabled": False}}

        seen: list[str] = []

        def toggled():  # settings.json may exist before the toggle lands (workspace trust is set there first)
            path = get_state(env.ctx, {"type": "vm_file",
                                       "path": "/home/user/.config/Code/User/settings.json",
                                       "dest": "s.json"})  # fmt: skip
            if path:
                seen[:] = [open(path).read()]
            return path if path and METRICS["check_json_settings"](path, rules) == 1.0 else None

        settings = _until(toggled, 30)
        assert settings, f"the workbench did not write editor.minimap.enabled: false; settings.json: {seen}"
        episode = env.provider.desktop.episode_id
    assert episode_pids(episode) == []  # code-server, its extension host and the window went with the desktop
