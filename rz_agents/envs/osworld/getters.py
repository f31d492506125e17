"""Getters: read a piece of desktop state for a metric (``evaluator.result`` / ``expected``).

A getter is ``(ctx, config) -> value``. File and command getters go through the in-VM server;
Chrome getters read the live browser over CDP or the profile files Chrome writes
(``~/.config/google-chrome/Default/Preferences``, ``Bookmarks``, ``History``, ``Local State``).
``UNAVAILABLE`` lists getters that exist in OSWorld but cannot work on this desktop, and why.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from rz_agents.envs.osworld.cache import cloud_file_items, cloud_file_path, is_local_url
from rz_agents.envs.osworld.chrome import active_page, pages
from rz_agents.envs.osworld.context import EpisodeContext
from rz_agents.envs.osworld.getters_more import GETTERS as MORE_GETTERS
from rz_agents.envs.osworld.vm_state import (
    chrome_call,
    get_vm_command_error,
    get_vm_command_line,
    get_vm_file,
    given,
)

CHROME_DIR = "/home/user/.config/google-chrome"
PROFILE_DIR = CHROME_DIR + "/Default"

UNAVAILABLE: dict[str, str] = {
    "googledrive_file": "reads a Google Drive account through its API (needs internet and the user's "
                        "credentials)",
    "info_from_website": "reads a live website (needs internet)",
    "gotoRecreationPage_and_get_html_content": "navigates recreation.gov (needs internet)",
    "calc_insensitive_md5": "not a getter of OSWorld (its task cannot be scored there either)",
}


def getter_problem(kind: str) -> str | None:
    """Why an implemented getter cannot work on this machine's desktops (None when it can)."""
    if kind == "vm_terminal_output":
        from rz_agents.envs.osworld.session import atspi_problem
        from rz_agents.envs.osworld.terminal import terminal_problem

        problem = terminal_problem() or atspi_problem()
        return f"reads a GNOME terminal's accessibility tree: {problem}" if problem else None
    if kind == "vm_wallpaper":
        from rz_agents.envs.osworld.gsettings import gsettings_problem

        problem = gsettings_problem(["org.gnome.desktop.background"])
        return f"reads GNOME's background setting: {problem}" if problem else None
    return None


class GetterError(RuntimeError):
    """A getter cannot read its state here; the message says why (e.g. a file not in the cache)."""


def get_rule(ctx: EpisodeContext, config: dict[str, Any]) -> Any:
    """The literal ``rules`` object of the config."""
    return config["rules"]


def get_cloud_file(ctx: EpisodeContext, config: dict[str, Any]) -> str | list[str | None] | None:
    """A gold file from the input cache (``rz osworld fetch``), copied into the evaluation folder.

    Not cached: downloaded when the episode allows the network, else ``GetterError`` saying where
    the file is expected.
    """
    out: list[str | None] = []
    for url, dest in cloud_file_items(config):
        cached = cloud_file_path(ctx.download_cache, ctx.task_id, dest)
        local = os.path.join(ctx.work_dir, os.path.basename(dest))
        if os.path.isfile(cached):
            shutil.copyfile(cached, local)
        elif is_local_url(url) or ctx.allow_network:
            try:
                with urllib.request.urlopen(url, timeout=120) as resp, open(local, "wb") as f:
                    shutil.copyfileobj(resp, f)
            except OSError as exc:
                raise GetterError(f"cloud_file: download of {url} failed: {exc}") from exc
        else:
            raise GetterError(f"needs internet download: {url} (put the file at {cached} to run offline)")
        out.append(local)
    return given(out, config)


def get_cache_file(ctx: EpisodeContext, config: dict[str, Any]) -> str | None:
    """A file an earlier step wrote (``execute`` with ``stdout``), or one in the task's input cache."""
    name = str(config["path"])
    for candidate in (
        os.path.join(ctx.work_dir, os.path.basename(name)),
        os.path.join(ctx.download_cache, ctx.task_id, name),
    ):
        if os.path.isfile(candidate):
            return candidate
    return None


def _copy_out(ctx: EpisodeContext, path: str, dest: str) -> str | None:
    """Copy one desktop file to ``<work_dir>/<dest>``; None when it does not exist."""
    data = ctx.client.get_file(path)
    if data is None:
        return None
    local = os.path.join(ctx.work_dir, os.path.basename(dest))
    with open(local, "wb") as f:
        f.write(data)
    return local


def get_gimp_config_file(ctx: EpisodeContext, config: dict[str, Any]) -> str | None:
    """A file of GIMP 2.10's settings folder (``~/.config/GIMP/2.10/<file_name>``)."""
    name = config["file_name"]
    return _copy_out(ctx, f"/home/user/.config/GIMP/2.10/{name}", config.get("dest") or name)


def get_vlc_config(ctx: EpisodeContext, config: dict[str, Any]) -> str | None:
    """VLC's settings file (``~/.config/vlc/vlcrc``)."""
    return _copy_out(ctx, "/home/user/.config/vlc/vlcrc", config.get("dest") or "vlcrc")


VLC_HTTP = ("127.0.0.1", 8080, "password")  # what the desktop's vlc wrapper enables (providers/wrappers.py)


def get_vlc_playing_info(ctx: EpisodeContext, config: dict[str, Any]) -> str | None:
    """VLC's ``status.xml`` from its HTTP interface (fetched inside the desktop: its loopback is its own)."""
    host, port, password = VLC_HTTP
    code = (
        "import base64, sys, urllib.request\n"
        f"req = urllib.request.Request('http://{host}:{port}/requests/status.xml')\n"
        f"req.add_header('Authorization', 'Basic ' + base64.b64encode(b':{password}').decode())\n"
        "sys.stdout.write(urllib.request.urlopen(req, timeout=10).read().decode())"
    )
    result = ctx.client.execute(["python3", "-c", code])
    if result.get("returncode") != 0 or not result.get("output"):
        return None
    local = os.path.join(ctx.work_dir, os.path.basename(config.get("dest") or "status.xml"))
    with open(local, "w") as f:
        f.write(result["output"])
    return local


def get_accessibility_tree(ctx: EpisodeContext, config: dict[str, Any]) -> str:
    """The desktop's accessibility tree (XML)."""
    return ctx.client.accessibility_tree()


def get_vm_screen_size(ctx: EpisodeContext, config: dict[str, Any]) -> dict[str, int]:
    """``{"width", "height"}`` of the screen."""
    w, h = ctx.client.screen_size()
    return {"width": w, "height": h}


def get_vm_window_size(ctx: EpisodeContext, config: dict[str, Any]) -> dict[str, int] | None:
    """``{"width", "height"}`` of the first window whose class is ``app_class_name`` (case-insensitive)."""
    want = str(config["app_class_name"]).lower()
    for w in ctx.client.windows():
        if str(w.get("class", "")).lower() == want:
            return {"width": w["w"], "height": w["h"]}
    return None


def get_list_directory(ctx: EpisodeContext, config: dict[str, Any]) -> dict[str, Any] | None:
    """The directory tree at ``path`` (``{"name", "type", "children"}``), None if missing."""
    return ctx.client.list_directory(config["path"])


# --- Chrome, live (CDP) ------------------------------------------------------------------------


def _tab(page: Any, content: bool) -> dict[str, Any]:
    info = {"title": page.title(), "url": page.url}
    if content:
        info["content"] = page.content()
    return info


def get_active_tab_info(ctx: EpisodeContext, config: dict[str, Any]) -> dict[str, Any] | None:
    """``{"title", "url", "content"}`` of the tab on screen, None when Chrome is not running."""

    def grab(browser: Any) -> dict[str, Any] | None:
        page = active_page(browser)
        return _tab(page, content=True) if page is not None else None

    return chrome_call(ctx, grab)


def get_open_tabs_info(ctx: EpisodeContext, config: dict[str, Any]) -> list[dict[str, Any]] | None:
    """``[{"title", "url"}]`` for every open tab."""

    def grab(browser: Any) -> list[dict[str, Any]]:
        out = []
        for page in pages(browser):
            try:
                out.append(_tab(page, content=False))
            except Exception:
                # Closed by the agent after Playwright last looked (its close event not yet seen).
                continue
        return out

    return chrome_call(ctx, grab)


def get_active_url(ctx: EpisodeContext, config: dict[str, Any]) -> str | None:
    """The active tab's URL (OSWorld reads it from the address bar; CDP gives the same value)."""
    info = get_active_tab_info(ctx, config)
    return info["url"] if info else None


def get_active_tab_url_parse(ctx: EpisodeContext, config: dict[str, Any]) -> dict[str, Any] | None:
    """Selected query parameters of the active URL (``parse_keys``, renamed by ``replace``)."""
    url = get_active_url(ctx, config)
    if url is None:
        return None
    query = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    out = {k: query[k][0] for k in config.get("parse_keys", []) if k in query}
    for old, new in (config.get("replace") or {}).items():
        if old in out:
            out[new] = out.pop(old)
    return out


def get_url_dash_part(ctx: EpisodeContext, config: dict[str, Any]) -> Any:
    """One ``/``-separated part of the active URL (``partIndex``), as a string or ``{key: part}``."""
    url = get_active_url(ctx, config)
    if url is None:
        return None
    if config.get("needDeleteId"):
        url = url.split("?")[0].split("#")[0]
    parts = url.split("/")
    try:
        part = parts[int(config["partIndex"])]
    except (IndexError, ValueError):
        return None
    return {config["key"]: part} if config.get("returnType") == "json" else part


def get_page_info(ctx: EpisodeContext, config: dict[str, Any]) -> dict[str, Any] | None:
    """Open ``url`` in a new tab and return its ``{"title", "url", "content"}``."""

    def grab(browser: Any) -> dict[str, Any]:
        context = browser.contexts[0] if browser.contexts else browser.new_context()
        page = context.new_page()
        page.goto(config["url"], timeout=30000)
        return _tab(page, content=True)

    return chrome_call(ctx, grab)


# --- Chrome, profile files ---------------------------------------------------------------------


def _json_file(ctx: EpisodeContext, path: str) -> dict[str, Any]:
    data = ctx.client.get_file(path)
    if data is None:
        return {}
    try:
        return json.loads(data)
    except json.JSONDecodeError:
        return {}


def _preferences(ctx: EpisodeContext) -> dict[str, Any]:
    return _json_file(ctx, PROFILE_DIR + "/Preferences")


def get_enable_do_not_track(ctx: EpisodeContext, config: dict[str, Any]) -> str:
    """``"true"`` when Do Not Track is on in the profile, else ``"false"``."""
    return "true" if _preferences(ctx).get("enable_do_not_track") else "false"


def get_enable_enhanced_safety_browsing(ctx: EpisodeContext, config: dict[str, Any]) -> str:
    """``"true"`` when Safe Browsing's enhanced protection is on."""
    return "true" if _preferences(ctx).get("safebrowsing", {}).get("enhanced") else "false"


def get_data_delete_automacally(ctx: EpisodeContext, config: dict[str, Any]) -> str:  # (OSWorld's spelling)
    """``"true"`` when the profile has default content settings (auto-delete of site data configured)."""
    return (
        "true"
        if _preferences(ctx).get("profile", {}).get("default_content_setting_values") is not None
        else "false"
    )


def get_default_search_engine(ctx: EpisodeContext, config: dict[str, Any]) -> str:
    """The default search engine's short name (``Google`` when never changed)."""
    data = _preferences(ctx).get("default_search_provider_data", {}).get("template_url_data", {})
    return data.get("short_name", "Google")


def get_chrome_font_size(ctx: EpisodeContext, config: dict[str, Any]) -> dict[str, Any]:
    """Font sizes from the profile (Chrome's defaults when never changed)."""
    prefs = _preferences(ctx).get("webkit", {}).get("webprefs", {})
    return {
        "default_fixed_font_size": prefs.get("default_fixed_font_size", 13),
        "default_font_size": prefs.get("default_font_size", 16),
        "minimum_font_size": prefs.get("minimum_font_size", 0),
    }


def get_profile_name(ctx: EpisodeContext, config: dict[str, Any]) -> str | None:
    """The profile's display name."""
    return _preferences(ctx).get("profile", {}).get("name")


def get_bookmarks(ctx: EpisodeContext, config: dict[str, Any]) -> dict[str, Any]:
    """The ``roots`` of the profile's Bookmarks file (``{}`` when there are none)."""
    return _json_file(ctx, PROFILE_DIR + "/Bookmarks").get("roots", {})


def get_enabled_experiments(ctx: EpisodeContext, config: dict[str, Any]) -> list[str]:
    """Names of flags enabled in ``chrome://flags`` (from ``Local State``)."""
    return _json_file(ctx, CHROME_DIR + "/Local State").get("browser", {}).get("enabled_labs_experiments", [])


def _sqlite_rows(ctx: EpisodeContext, path: str, query: str) -> list[tuple] | None:
    data = ctx.client.get_file(path)
    if data is None:
        return None
    local = os.path.join(ctx.work_dir, os.path.basename(path) + ".sqlite")
    with open(local, "wb") as f:
        f.write(data)
    try:
        with sqlite3.connect(local) as db:
            return db.execute(query).fetchall()
    except sqlite3.Error:
        return None


def get_history(ctx: EpisodeContext, config: dict[str, Any]) -> list[tuple] | None:
    """``(url, title, last_visit_time)`` rows of the profile's History database."""
    return _sqlite_rows(ctx, PROFILE_DIR + "/History", "SELECT url, title, last_visit_time FROM urls")


def get_cookie_data(ctx: EpisodeContext, config: dict[str, Any]) -> list[tuple] | None:
    """Rows of the profile's Cookies database."""
    return _sqlite_rows(ctx, PROFILE_DIR + "/Cookies", "SELECT * FROM cookies")


def get_shortcuts_on_desktop(ctx: EpisodeContext, config: dict[str, Any]) -> dict[str, str]:
    """``{file name: content}`` of the ``.desktop`` launchers on the Desktop."""
    tree = ctx.client.list_directory("/home/user/Desktop") or {"children": []}
    out = {}
    for child in tree["children"]:
        if child["type"] == "file" and child["name"].endswith(".desktop"):
            data = ctx.client.get_file("/home/user/Desktop/" + child["name"])
            out[child["name"]] = (data or b"").decode(errors="replace")
    return out


GETTERS: dict[str, Callable[[EpisodeContext, dict[str, Any]], Any]] = {
    "rule": get_rule,
    "vm_command_line": get_vm_command_line,
    "vm_command_error": get_vm_command_error,
    "vm_file": get_vm_file,
    "cloud_file": get_cloud_file,
    "cache_file": get_cache_file,
    "list_directory": get_list_directory,
    "gimp_config_file": get_gimp_config_file,
    "vlc_config": get_vlc_config,
    "vlc_playing_info": get_vlc_playing_info,
    "accessibility_tree": get_accessibility_tree,
    "vm_screen_size": get_vm_screen_size,
    "vm_window_size": get_vm_window_size,
    "enable_enhanced_safety_browsing": get_enable_enhanced_safety_browsing,
    "data_delete_automacally": get_data_delete_automacally,
    "active_tab_info": get_active_tab_info,
    "open_tabs_info": get_open_tabs_info,
    "active_url_from_accessTree": get_active_url,
    "active_tab_url_parse": get_active_tab_url_parse,
    "url_dashPart": get_url_dash_part,
    "page_info": get_page_info,
    "enable_do_not_track": get_enable_do_not_track,
    "default_search_engine": get_default_search_engine,
    "chrome_font_size": get_chrome_font_size,
    "profile_name": get_profile_name,
    "bookmarks": get_bookmarks,
    "enabled_experiments": get_enabled_experiments,
    "history": get_history,
    "cookie_data": get_cookie_data,
    "shortcuts_on_desktop": get_shortcuts_on_desktop,
}


GETTERS.update(MORE_GETTERS)


def get_state(ctx: EpisodeContext, config: dict[str, Any]) -> Any:
    """Dispatch ``config["type"]`` to its getter; ``KeyError`` naming it when not implemented."""
    kind = config["type"]
    fn = GETTERS.get(kind)
    if fn is None:
        raise KeyError(
            f"getter not implemented: {kind}" + (f" ({UNAVAILABLE[kind]})" if kind in UNAVAILABLE else "")
        )
    return fn(ctx, config)
