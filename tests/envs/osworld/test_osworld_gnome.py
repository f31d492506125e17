"""GNOME pieces of OSWorld's VM on the local desktop, without GNOME Shell: Ctrl+Alt+T opens GNOME
Terminal and ``vm_terminal_output`` reads it over AT-SPI; ``gsettings`` keeps settings through the
desktop's own bus at ``/run/user/1000/bus`` (as the tasks export it) and ``vm_wallpaper`` reads
the background it names; ``pulseaudio``/``pactl`` run a per-desktop sound server. Each desktop's
helpers (terminal server, dconf, pulseaudio) end with it."""

from __future__ import annotations

import shutil

import pytest
from osworld_polling import until

from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.getters import get_state
from rz_agents.envs.osworld.gsettings import gsettings_problem
from rz_agents.envs.osworld.metrics import METRICS
from rz_agents.envs.osworld.providers.local import episode_pids
from rz_agents.envs.osworld.session import atspi_problem
from rz_agents.envs.osworld.terminal import openbox_config, terminal_output, terminal_problem

ST = "https://accessibility.ubuntu.example.org/ns/state"
BUS = "export DBUS_SESSION_BUS_ADDRESS='unix:path=/run/user/1000/bus'\n"
needs_desktop = pytest.mark.skipif(not shutil.which("Xvfb"), reason="needs xvfb (scripts/install.sh)")


def _until(fn, timeout_s=20.0):
    return until(fn, timeout_s, 0.3)


def _tree(*frames: str) -> str:
    return (
        f'<desktop-frame xmlns:st="{ST}">'
        f'<application name="gnome-terminal-server">{"".join(frames)}</application></desktop-frame>'
    )


def test_terminal_output_is_the_focused_terminal_of_the_active_frame_right_stripped():
    active = (
        '<frame st:active="true"><filler><terminal st:focused="true">$ ls\na  b\n$ \n\n'
        '</terminal></filler></frame>'
    )
    assert terminal_output(_tree(active)) == "$ ls\na  b\n$"
    inactive = '<frame><terminal st:focused="true">x</terminal></frame>'
    assert terminal_output(_tree(inactive)) is None
    unfocused = '<frame st:active="true"><terminal>x</terminal></frame>'
    assert terminal_output(_tree(unfocused)) is None
    two = (
        '<frame st:active="true"><terminal st:focused="true">a</terminal>'
        '<terminal st:focused="true">b</terminal></frame>'
    )
    assert terminal_output(_tree(two)) is None  # the official xpath needs exactly one
    other_app = active.replace("$ ls", "other")
    xml = (
        f'<desktop-frame xmlns:st="{ST}"><application name="xterm">{other_app}</application></desktop-frame>'
    )
    assert terminal_output(xml) is None


def test_openbox_config_keeps_the_system_file_and_adds_ctrl_alt_t(tmp_path):
    rc = tmp_path / "rc.xml"
    rc.write_text(
        "<openbox_config><keyboard><chainQuitKey>C-g</chainQuitKey></keyboard><mouse>M</mouse></openbox_config>"
    )
    path = openbox_config(str(tmp_path), str(rc))
    if terminal_problem() is not None:
        assert path is None
        return
    text = open(path).read()
    assert '<keybind key="C-A-t"><action name="Execute"><command>gnome-terminal</command>' in text
    assert "<chainQuitKey>C-g</chainQuitKey>" in text and "<mouse>M</mouse>" in text
    rc.write_text("<openbox_config/>")
    assert openbox_config(str(tmp_path), str(rc)) is None  # nothing to extend


@needs_desktop
@pytest.mark.skipif(
    terminal_problem() is not None or atspi_problem() is not None,
    reason=f"needs gnome-terminal and AT-SPI ({terminal_problem() or atspi_problem()})",
)
def test_ctrl_alt_t_opens_gnome_terminal_and_its_text_is_the_terminal_output():
    with DesktopEnv(require_screenshot=False) as env:
        env.reset(None)
        assert get_state(env.ctx, {"type": "vm_terminal_output"}) is None  # no terminal yet
        env.ctx.client.run_python("pyautogui.hotkey('ctrl', 'alt', 't')")
        window = _until(lambda: [w for w in env.ctx.client.windows() if w["class"] == "Gnome-terminal"])
        assert window and window[0]["active"] and window[0]["name"] == "Terminal"
        _until(lambda: get_state(env.ctx, {"type": "vm_terminal_output"}))
        env.ctx.client.run_python("pyautogui.write('echo $((6*7)); stty size'); pyautogui.press('enter')")
        out = _until(
            lambda: (lambda t: t if t and "24 80" in t else None)(
                get_state(env.ctx, {"type": "vm_terminal_output"})
            )
        )
        assert out and "\n42\n24 80\nuser@desktop:~$" in out and out == out.rstrip()
        assert METRICS["check_include_exclude"](out, {"include": ["42\n"], "exclude": []}) == 1.0
        episode = env.provider.desktop.episode_id
    assert episode_pids(episode) == []  # gnome-terminal-server and its shell went with the desktop


@needs_desktop
@pytest.mark.skipif(
    gsettings_problem(["org.gnome.shell"]) is not None, reason=str(gsettings_problem(["org.gnome.shell"]))
)
def test_gsettings_keep_values_on_the_tasks_bus_path_and_the_wallpaper_getter_reads_them(tmp_path):
    with DesktopEnv(require_screenshot=False) as env:
        env.reset(None)
        run = env.ctx.client.execute
        set_favs = (
            BUS + "gsettings set org.gnome.shell favorite-apps \"['thunderbird.desktop', 'vim.desktop']\""
        )
        assert run(set_favs, shell=True)["returncode"] == 0
        got = get_state(
            env.ctx,
            {
                "type": "vm_command_line",
                "command": BUS + "gsettings get org.gnome.shell favorite-apps",
                "shell": True,
            },
        )
        assert got == "['thunderbird.desktop', 'vim.desktop']\n"
        assert (
            METRICS["check_gnome_favorite_apps"](got, {"expected": ["vim.desktop", "thunderbird.desktop"]})
            == 1.0
        )
        # a list command without the export reaches the same bus (the session's own address)
        run(["gsettings", "set", "org.gnome.desktop.session", "idle-delay", "0"])
        assert run(["gsettings", "get", "org.gnome.desktop.session", "idle-delay"])["output"] == "uint32 0\n"
        assert (
            get_state(env.ctx, {"type": "vm_wallpaper", "dest": "w.png"}) is None
        )  # the default names no file here
        run(
            "python3 -c \"from PIL import Image; Image.new('RGB', (8, 8), 'red').save('/home/user/w.png')\"",
            shell=True,
        )
        run("gsettings set org.gnome.desktop.background picture-uri file:///home/user/w.png", shell=True)
        env.ctx.work_dir = str(tmp_path)
        local = get_state(env.ctx, {"type": "vm_wallpaper", "dest": "result_wallpaper.png"})
        assert local == str(tmp_path / "result_wallpaper.png")
        assert open(local, "rb").read() == env.ctx.client.get_file("/home/user/w.png")
        env.reset(None)  # a fresh desktop: the settings were the episode's
        assert (
            env.ctx.client.execute(["gsettings", "get", "org.gnome.desktop.session", "idle-delay"])["output"]
            == "uint32 300\n"
        )


@needs_desktop
@pytest.mark.skipif(
    not (shutil.which("pulseaudio") and shutil.which("pactl")), reason="needs pulseaudio (apt)"
)
def test_pulseaudio_runs_per_desktop_and_pactl_sets_its_volume():
    with DesktopEnv(require_screenshot=False) as env:
        env.reset(None)
        volume = "pactl list sinks | grep '^[[:space:]]Volume:' | head -n 1 | awk '{print $5}' | sed 's/%//g'"
        run = env.ctx.client.execute
        assert run("pulseaudio --start\n" + volume, shell=True)["output"].strip().isdigit()
        assert run("pactl set-sink-volume @DEFAULT_SINK@ 40%", shell=True)["returncode"] == 0
        assert run("pulseaudio --start\n" + volume, shell=True)["output"] == "40\n"
        episode = env.provider.desktop.episode_id
    assert episode_pids(episode) == []
