"""Application settings metrics: GIMP's ``gimprc``/``sessionrc``, LibreOffice's registry, Thunderbird's
``prefs.js`` and filters, VLC's ``vlcrc`` and its status XML.

Each reads the settings file a getter copied out of the desktop, the way OSWorld's checks read it
(e.g. VLC options are found with ``key=`` anywhere in a line, so the commented default counts).
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Callable
from typing import Any
from xml.etree import ElementTree as ET

from rz_agents.envs.osworld.metrics.general import read_text
from rz_agents.envs.osworld.metrics.rules import match_record, match_value_to_rule

OOR = "http://openoffice.org/2001/registry"


# --- GIMP -----------------------------------------------------------------------------------------


def check_config_status(actual_config_path: str | None, rule: dict[str, Any], **_: Any) -> float:
    """1 when a ``(key ... value)`` line of the GIMP config has ``rule["key"]`` (or the two words of a list
    key) first and ``rule["value"]`` last."""
    text = read_text(actual_config_path)
    if text is None:
        return 0.0
    key, value = rule["key"], rule["value"]
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        items = line.strip().lstrip("(").rstrip(")").split()
        if not items:
            continue
        if isinstance(key, str) and items[0] == key and items[-1] == value:
            return 1.0
        if isinstance(key, list) and len(key) == 2 and items[:2] == key and items[-1] == value:
            return 1.0
    return 0.0


# --- LibreOffice (registrymodifications.xcu) ------------------------------------------------------


def _registry_value(path: str | None, item_path: str, name: str) -> str | None:
    """The value of property ``name`` under ``item_path`` in a LibreOffice registry file."""
    if not path:
        return None
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    value = None
    for item in root.iter("item"):
        if item.get(f"{{{OOR}}}path") != item_path:
            continue
        for prop in item.iter("prop"):
            if prop.get(f"{{{OOR}}}name") == name:
                v = prop.find("value")
                value = v.text if v is not None else None
    return value


def check_presenter_console_disable(config_file: str | None, **_: Any) -> float:
    """1 when Impress's presenter screen is switched off."""
    value = _registry_value(config_file, "/org.openoffice.Office.Impress/Misc/Start", "EnablePresenterScreen")
    return float(value is not None and value.lower() == "false")


def check_auto_saving_time(config_file: str | None, rules: dict[str, Any], **_: Any) -> float:
    """1 when LibreOffice's autosave interval is ``rules["minutes"]``."""
    value = _registry_value(
        config_file, "/org.openoffice.Office.Common/Save/Document", "AutoSaveTimeIntervall"
    )
    try:
        return float(value is not None and int(value) == int(rules["minutes"]))
    except ValueError:
        return 0.0


def find_default_font(config_file: str | None, rules: dict[str, Any], **_: Any) -> float:
    """1 when Writer's default (Standard) font is ``rules["font_name"]``."""
    return float(
        _registry_value(config_file, "/org.openoffice.Office.Writer/DefaultFont", "Standard")
        == rules["font_name"]
    )


# --- Thunderbird ----------------------------------------------------------------------------------

_PREF = re.compile(r'^user_pref\("(?P<key>(?:[^"]|\\")+)", (?P<val>.+)\);$')


def check_thunderbird_prefs(result: str | None, rule: dict[str, Any], **_: Any) -> float:
    """``prefs.js`` against rules: each ``expect`` key is present and matches; no ``unexpect`` key matches."""
    text = read_text(result)
    if text is None:
        return 0.0
    expect, unexpect = rule.get("expect", {}), rule.get("unexpect", {})
    found = dict.fromkeys(expect, False)
    for line in text.splitlines():
        m = _PREF.match(line.strip())
        if m is None:
            continue
        key = m.group("key")
        try:
            value = json.loads(m.group("val"))
        except json.JSONDecodeError:
            continue
        if key in expect:
            found[key] = match_value_to_rule(value, expect[key])
        elif key in unexpect and match_value_to_rule(value, unexpect[key]):
            return 0.0
    return float(all(found.values()))


_CONDITION = re.compile(r'\b(?:AND|OR) \((?:[\w ]+),(?:[\w \']+),(?:"(?:(?:[^"]|\")+)"|(?:[^)]+))\)|\bALL\b')


def _filter_value(line: str, prefix: str) -> str:
    raw = line[len(prefix) + 1 : -1] if line.endswith('"') else line[len(prefix) + 1 :]
    return raw.replace('\\"', '"').replace("\\\\", "\\")


def thunderbird_filters(text: str) -> list[dict[str, Any]]:
    """The filters of a ``msgFilterRules.dat``: name, enabled, type, action, actionValue, condition."""
    filters: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for line in text.splitlines():
        key = line.split("=", 1)[0]
        if key not in ("name", "enabled", "type", "action", "actionValue", "condition"):
            continue
        value = _filter_value(line, key + "=")
        if key == "name":
            current = {"name": value}
        elif key == "condition":
            current["condition"] = _CONDITION.findall(value)
            filters.append(current)
        else:
            current[key] = value
    return filters


def check_thunderbird_filter(result: str | None, rules: dict[str, Any], **_: Any) -> float:
    """Filters against rules: each ``expect`` record is matched by a filter, no ``unexpect`` one is."""
    text = read_text(result)
    if text is None:
        return 0.0
    filters = thunderbird_filters(text)
    if not all(any(match_record(r, f) for f in filters) for r in rules.get("expect", [])):
        return 0.0
    return float(not any(match_record(r, f) for r in rules.get("unexpect", []) for f in filters))


def check_thunderbird_folder(
    result: str | list[str] | None, reference: str | list[str] | None, **options: Any
) -> float:
    """1 when each mbox folder holds the same messages as its reference (``ignore_status``,
    ``ignore_keys``, ``remove_deleted`` (default on), ``remove_duplicate`` (default on))."""

    def messages(path: str) -> str:
        mails = []
        for mail in (read_text(path) or "").strip().split("FROM - "):
            if not mail.strip():
                continue
            if options.get("remove_deleted", True) and re.search(r"X-Mozilla-Status: 000[89]", mail):
                continue
            if options.get("ignore_status", False):
                mail = re.sub(r"X-Mozilla-Status\d?:[\s\d]+", "", mail)
            if options.get("ignore_keys", False):
                mail = re.sub(r"(X-Mozilla-Keys:[^\n]*?)\n(MIME-Version)", r"\2", mail)
            mails.append("FROM - " + mail.strip())
        if options.get("remove_duplicate", True):
            mails = list(set(mails))
        return "\n".join(sorted(mails))

    results = result if isinstance(result, list) else [result]
    references = reference if isinstance(reference, list) else [reference]
    for a, b in zip(results, references, strict=False):
        if a is None or b is None or not os.path.isfile(a) or messages(a) != messages(b):
            return 0.0
    return 1.0


# --- VLC ------------------------------------------------------------------------------------------


def _vlc_option(path: str | None, key: str, default: str) -> str | None:
    """The last ``key=`` value in vlcrc (OSWorld matches commented defaults too), else ``default``."""
    text = read_text(path)
    if text is None:
        return None
    value = default
    for line in text.splitlines():
        if f"{key}=" in line:
            value = line.split("=")[-1].strip()
    return value


def _vlc_equals(key: str, default: str, rule_key: str) -> Callable[..., float]:
    def metric(actual_config_path: str | None, rule: dict[str, Any], **_: Any) -> float:
        value = _vlc_option(actual_config_path, key, default)
        return float(value is not None and value == str(rule[rule_key]))

    metric.__doc__ = f"1 when VLC's ``{key}`` is ``rule[{rule_key!r}]`` (default {default!r})."
    return metric


def is_vlc_recordings_folder(actual_config_path: str | None, rule: dict[str, Any], **_: Any) -> float:
    """1 when the first uncommented ``input-record-path`` is ``rule["recording_file_path"]``."""
    text = read_text(actual_config_path)
    if text is None:
        return 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if "input-record-path" in line:
            return float(line.split("=")[-1].strip() == rule["recording_file_path"])
    return 0.0


def check_qt_slider_colours(actual_config_path: str | None, rule: dict[str, Any], **_: Any) -> float:
    """``qt-slider-colours`` equals ``expected_qt_slider_colours`` (``type: match``) or every RGB triple
    is below 100 (``type: blackish``)."""
    value = _vlc_option(actual_config_path, "qt-slider-colours", "153;210;153;20;210;20;255;199;15;245;39;29")
    if value is None:
        return 0.0
    if rule["type"] == "match":
        return float(value == rule["expected_qt_slider_colours"])
    if rule["type"] == "blackish":
        try:
            numbers = [int(x) for x in value.split(";")]
        except ValueError:
            return 0.0
        return float(all(v < 100 for v in numbers[: len(numbers) // 3 * 3]))
    raise ValueError(f"check_qt_slider_colours: rule type {rule['type']!r} not supported")


def check_global_key_play_pause(actual_config_path: str | None, rule: dict[str, Any], **_: Any) -> float:
    """1 when the global play/pause hotkey is set (``"1"``) or empty (``"0"``) as ``rule`` expects."""
    text = read_text(actual_config_path)
    if text is None:
        return 0.0
    state = "0"
    for line in text.splitlines():
        if "global-key-play-pause=" in line:
            state = "0" if line.split("=")[-1].strip() == "" else "1"
    return float(state == str(rule["expected_global_key_play_pause"]))


def is_vlc_playing(actual_status_path: str | None, rule: dict[str, Any], **_: Any) -> float:
    """1 when VLC's status XML says ``playing`` the file (``type: file_name``) or URL (``type: url``)."""
    text = read_text(actual_status_path)
    if not text:
        return 0.0
    tree = ET.fromstring(text)
    if (tree.findtext("state") or "") != "playing":
        return 0.0

    def meta(*names: str) -> str | None:
        for name in names:
            v = tree.findtext(f'information/category[@name="meta"]/info[@name="{name}"]')
            if v:
                return v
        return None

    if rule["type"] == "file_name":
        info = meta("filename", "title", "uri", "location", "name")
        if not info:
            return 0.0
        want = rule["file_name"]
        return float(os.path.basename(info) == want or info.endswith(want))
    if rule["type"] == "url":
        info = meta("url", "URI", "location", "title", "filename")
        if not info:
            return 0.0
        want = rule["url"]
        if want in info or info == os.path.basename(urllib.parse.urlparse(want).path):
            return 1.0
        got = urllib.parse.urlparse(info)
        exp = urllib.parse.urlparse(want)
        return float("://" in info and got.netloc == exp.netloc and exp.path in got.path)
    raise ValueError(f"is_vlc_playing: rule type {rule['type']!r} not supported")


def is_vlc_fullscreen(actual_window_size: Any, screen_size: Any, **_: Any) -> float:
    """1 when the window is as large as the screen."""
    if not actual_window_size or not screen_size:
        return 0.0
    return float(
        actual_window_size["width"] == screen_size["width"]
        and actual_window_size["height"] == screen_size["height"]
    )


METRICS: dict[str, Callable[..., float]] = {
    "check_config_status": check_config_status,
    "check_presenter_console_disable": check_presenter_console_disable,
    "check_auto_saving_time": check_auto_saving_time,
    "find_default_font": find_default_font,
    "check_thunderbird_prefs": check_thunderbird_prefs,
    "check_thunderbird_filter": check_thunderbird_filter,
    "check_thunderbird_folder": check_thunderbird_folder,
    "is_vlc_recordings_folder": is_vlc_recordings_folder,
    "check_qt_bgcone": _vlc_equals("qt-bgcone", "1", "expected_qt_bgcone"),
    "check_qt_max_volume": _vlc_equals("qt-max-volume", "125", "expected_qt_max_volume"),
    "check_qt_minimal_view": _vlc_equals("qt-minimal-view", "0", "expected_qt_minimal_view"),
    "check_one_instance_when_started_from_file": _vlc_equals(
        "one-instance-when-started-from-file", "1", "expected_one_instance_when_started_from_file"
    ),
    "check_qt_slider_colours": check_qt_slider_colours,
    "check_global_key_play_pause": check_global_key_play_pause,
    "is_vlc_playing": is_vlc_playing,
    "is_vlc_fullscreen": is_vlc_fullscreen,
}
