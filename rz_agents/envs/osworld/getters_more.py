"""More getters from OSWorld's ``evaluators/getters`` (commit 8942695): Chrome profile lists and
page parsing, VS Code settings after a command, media inside slides, spreadsheet rows, VLC's
default-player lookup, relative dates and literal time ranges, the terminal's text and the wallpaper.

Each follows the official getter's result, its fallbacks included (the Chrome profile getters
answer ``"Google"`` when the Preferences file cannot be read, as there).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import posixpath
import zipfile
from collections import Counter
from collections.abc import Callable
from typing import Any
from xml.etree import ElementTree as ET

from rz_agents.envs.osworld.chrome import active_page
from rz_agents.envs.osworld.context import EpisodeContext
from rz_agents.envs.osworld.vm_state import chrome_call, get_vm_command_line, get_vm_file

PREFERENCES = "/home/user/.config/google-chrome/Default/Preferences"
REL_NS = "http://schemas.openxmlformats.org/package/2006/relationships"
P_NS = "http://schemas.openxmlformats.org/presentationml/2006/main"
A_NS = "http://schemas.openxmlformats.org/drawingml/2006/main"
R_NS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"


# --- Chrome ----------------------------------------------------------------------------------


def _preferences_or_none(ctx: EpisodeContext) -> dict[str, Any] | None:
    data = ctx.client.get_file(PREFERENCES)
    if data is None:
        return None
    try:
        return json.loads(data)
    except json.JSONDecodeError:
        return None


def get_new_startup_page(ctx: EpisodeContext, config: dict[str, Any]) -> str:
    """``"true"`` when Chrome opens the New Tab page (no ``session`` key, or ``restore_on_startup``
    is 5), ``"false"`` otherwise; ``"Google"`` when Preferences cannot be read (OSWorld's fallback)."""
    prefs = _preferences_or_none(ctx)
    if prefs is None:
        return "Google"
    if "session" not in prefs:
        return "true"
    return "true" if prefs.get("session", {}).get("restore_on_startup", {}) == 5 else "false"


def _extension_settings(ctx: EpisodeContext, pick: Callable[[dict[str, Any]], Any]) -> Any:
    prefs = _preferences_or_none(ctx)
    if prefs is None:
        return "Google"
    try:
        return [pick(ext) for ext in prefs.get("extensions", {}).get("settings", {}).values()]
    except (KeyError, TypeError):
        return "Google"  # an entry without the field: OSWorld's catch-all answer


def get_find_unpacked_extension_path(ctx: EpisodeContext, config: dict[str, Any]) -> Any:
    """The ``path`` of every extension in the profile's Preferences."""
    return _extension_settings(ctx, lambda ext: ext["path"])


def get_find_installed_extension_name(ctx: EpisodeContext, config: dict[str, Any]) -> Any:
    """The manifest ``name`` of every extension in the profile's Preferences."""
    return _extension_settings(ctx, lambda ext: ext["manifest"]["name"])


def parse_page(page: Any, config: dict[str, Any]) -> dict[str, str]:
    """OSWorld's ``active_tab_html_parse`` reading of one page, by ``category``.

    ``class``: ``class_multiObject`` ({class: {rank: key}}) and ``class_singleObject``
    ({class: key}, the first element) over ``.class`` elements' stripped text; ``label``: the first
    ``text=<label>`` match; ``xpath``: the first match's stripped text; ``input``: the first
    match's stripped input value. Keys with no element are left out.
    """
    out: dict[str, str] = {}
    category = config["category"]

    def texts(selector: str) -> list[str]:
        return [el.text_content().strip() for el in page.query_selector_all(selector) if el]

    if category == "class":
        for class_name, ranks in config.get("class_multiObject", {}).items():
            found = texts("." + class_name)
            for rank, key in ranks.items():
                if len(found) > int(rank):
                    out[key] = found[int(rank)]
        for class_name, key in config.get("class_singleObject", {}).items():
            found = texts("." + class_name)
            if found:
                out[key] = found[0]
    elif category == "label":
        for label, key in config.get("labelObject", {}).items():
            text = page.locator(f"text={label}").first.text_content().strip()
            if text:
                out[key] = text
    elif category == "xpath":
        for xpath, key in config.get("xpathObject", {}).items():
            found = page.locator(f"xpath={xpath}")
            if found.count() > 0:
                out[key] = found.first.text_content().strip()
    elif category == "input":
        for xpath, key in config.get("inputObject", {}).items():
            found = page.locator(f"xpath={xpath}")
            if found.count() > 0:
                out[key] = found.first.input_value().strip()
    return out


def get_active_tab_html_parse(ctx: EpisodeContext, config: dict[str, Any]) -> dict[str, str] | None:
    """Text of chosen elements of the active tab (see ``parse_page``); None without Chrome, ``{}``
    without a tab."""

    def grab(browser: Any) -> dict[str, str]:
        page = active_page(browser)
        if page is None:
            return {}
        try:
            page.wait_for_load_state("networkidle", timeout=10000)
        except Exception:
            pass  # a page that keeps polling: read it as it is
        return parse_page(page, config)

    return chrome_call(ctx, grab)


def get_pdf_from_url(ctx: EpisodeContext, config: dict[str, Any]) -> str | None:
    """Open ``path`` (a URL) in a new tab and print it to ``<work_dir>/<dest>`` (Chrome's
    ``Page.printToPDF``, which OSWorld's ``page.pdf`` calls)."""
    import base64

    def grab(browser: Any) -> str:
        context = browser.contexts[0] if browser.contexts else browser.new_context()
        page = context.new_page()
        page.goto(config["path"], timeout=60000)
        session = context.new_cdp_session(page)
        data = base64.b64decode(session.send("Page.printToPDF", {"printBackground": False})["data"])
        out = os.path.join(ctx.work_dir, os.path.basename(config["dest"]))
        with open(out, "wb") as f:
            f.write(data)
        page.close()
        return out

    return chrome_call(ctx, grab)


# --- VS Code -----------------------------------------------------------------------------------


def get_vscode_config(ctx: EpisodeContext, config: dict[str, Any]) -> Any:
    """Run a VS Code command (Ctrl+Shift+P, type it, Enter), wait 1 s, then copy ``path`` out."""
    command = json.dumps(config["vscode_extension_command"])
    ctx.client.run_python(
        f"pyautogui.hotkey('ctrl', 'shift', 'p')\npyautogui.typewrite({command})\npyautogui.press('enter')\n"
        "time.sleep(1.0)\n"
    )
    return get_vm_file(ctx, {"path": config["path"], "dest": config["dest"]})


# --- media inside presentations ----------------------------------------------------------------


def _slide_rels(z: zipfile.ZipFile, index: int) -> list[dict[str, str]]:
    name = f"ppt/slides/_rels/slide{index + 1}.xml.rels"
    if name not in z.namelist():
        return []
    return [r.attrib for r in ET.fromstring(z.read(name)).findall(f"{{{REL_NS}}}Relationship")]


def _media_out(
    ctx: EpisodeContext, local_pptx: str, z: zipfile.ZipFile, rel: dict[str, str], dest: str
) -> Any:
    """An embedded target (``../media/x``) is extracted next to the copied deck; an external one
    (``file://...``) is copied out of the desktop to ``dest``."""
    target = rel["Target"]
    if target.startswith(".."):
        inner = posixpath.normpath(posixpath.join("ppt/slides", target))
        folder = os.path.dirname(local_pptx)
        z.extract(inner, folder)
        return os.path.join(folder, inner)
    if not target.startswith("file://"):
        raise ValueError(f"unexpected media target {target!r}")
    return get_vm_file(ctx, {"path": target[len("file://") :], "dest": dest})


def _deck(ctx: EpisodeContext, config: dict[str, Any]) -> str | None:
    path = config["ppt_file_path"]
    return get_vm_file(ctx, {"path": path, "dest": os.path.basename(path)})


def get_audio_in_slide(ctx: EpisodeContext, config: dict[str, Any]) -> Any:
    """The audio file of slide ``slide_index`` (0-based): its first relationship whose type names
    audio. None when the slide has none."""
    local, index = _deck(ctx, config), int(config["slide_index"])
    if local is None:
        return None
    with zipfile.ZipFile(local) as z:
        for rel in _slide_rels(z, index):
            if "audio" in rel["Type"]:
                return _media_out(ctx, local, z, rel, config["dest"])
    return None


def get_background_image_in_slide(ctx: EpisodeContext, config: dict[str, Any]) -> Any:
    """The image a slide's background (``p:bgPr``) fills with: its first ``a:blip``'s relationship."""
    local, index = _deck(ctx, config), int(config["slide_index"])
    if local is None:
        return None
    with zipfile.ZipFile(local) as z:
        slide = f"ppt/slides/slide{index + 1}.xml"
        if slide not in z.namelist():
            return None
        image_id = None
        for bg in ET.fromstring(z.read(slide)).iter(f"{{{P_NS}}}bgPr"):
            for blip in bg.iter(f"{{{A_NS}}}blip"):
                image_id = blip.attrib.get(f"{{{R_NS}}}embed")
                break
            if image_id is not None:
                break
        if image_id is None:
            return None
        for rel in _slide_rels(z, index):
            if "image" in rel["Type"] and rel["Id"] == image_id:
                return _media_out(ctx, local, z, rel, config["dest"])
    return None


# --- files, players, dates --------------------------------------------------------------------


def last_row_as_text(path: str) -> list[str]:
    """``pd.read_excel(path).iloc[-1].astype(str).tolist()``: the last data row, each value as its
    column's type prints it (``2.0`` in a float column, ``nan`` for missing)."""
    import openpyxl

    from rz_agents.envs.osworld.metrics.xlsx import sheet_frame

    ws = openpyxl.load_workbook(path, data_only=True).worksheets[0]
    _names, columns = sheet_frame(ws)
    if not columns or not columns[0][1]:
        raise IndexError("content_from_vm_file: the sheet has no data rows")
    return [str(values[-1]) for _kind, values in columns]


def get_content_from_vm_file(ctx: EpisodeContext, config: dict[str, Any]) -> Any:
    """Part of a desktop file's content: ``file_type: xlsx``, ``file_content: last_row``."""
    path = get_vm_file(ctx, {"path": config["path"], "dest": os.path.basename(config["path"])})
    if config["file_type"] != "xlsx":
        raise NotImplementedError(f"content_from_vm_file: file type {config['file_type']} not supported")
    if config["file_content"] == "last_row":
        return last_row_as_text(path)
    return None


VIDEO_TYPES = (
    "3gp 3gp 3gpp 3gpp 3gpp2 3gpp2 avi avi divx divx dv dv fli fli flv flv mp2t mp2t mp4 mp4 mp4v-es "
    "mp4v-es mpeg mpeg mpeg-system mpeg-system msvideo msvideo ogg ogg quicktime quicktime vnd.divx "
    "vnd.divx vnd.mpegurl vnd.mpegurl vnd.rn-realvideo vnd.rn-realvideo webm webm x-anim x-anim x-avi "
    "x-avi x-flc x-flc x-fli x-fli x-flv x-flv x-m4v x-m4v x-matroska x-matroska x-mpeg x-mpeg "
    "x-mpeg-system x-mpeg-system x-mpeg2 x-mpeg2 x-ms-asf x-ms-asf x-ms-asf-plugin x-ms-asf-plugin "
    "x-ms-asx x-ms-asx x-ms-wm x-ms-wm x-ms-wmv x-ms-wmv x-ms-wmx x-ms-wmx x-ms-wvx x-ms-wvx x-msvideo "
    "x-msvideo x-nsv x-nsv x-ogm x-ogm x-ogm+ogg x-theora x-theora x-theora+ogg x-theora+ogg"
).split()  # OSWorld's list, repeats included (they weigh the vote)


def get_default_video_player(ctx: EpisodeContext, config: dict[str, Any]) -> str:
    """The ``.desktop`` file ``xdg-mime`` names most often for the video types (``unknown`` when none),
    its output kept as printed (trailing newline included), as OSWorld's vote keeps it."""
    apps = []
    for kind in VIDEO_TYPES:
        app = get_vm_command_line(ctx, {"command": ["xdg-mime", "query", "default", f"video/{kind}"]})
        if app:
            apps.append(app)
    return Counter(apps).most_common(1)[0][0] if apps else "unknown"


def get_time_diff_range(ctx: EpisodeContext, config: dict[str, Any]) -> Any:
    """The literal ``diff_range_in_minutes`` (None when absent)."""
    return config.get("diff_range_in_minutes")


DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
MONTHS_FULL = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
               "October", "November", "December"]  # fmt: skip


def format_day(template: str, day: dt.datetime) -> str:
    """OSWorld's ``apply_rules_to_timeFormat``: the first of each placeholder replaced, in its order
    (``{DoW} {Month} {DayD} {Year} {Month0D} {month} {MonthFull} {Day0D}``)."""
    for key, value in (
        ("{DoW}", DAYS[day.weekday()]),
        ("{Month}", MONTHS[day.month - 1]),
        ("{DayD}", str(day.day)),
        ("{Year}", str(day.year)),
        ("{Month0D}", f"{day.month:02d}"),
        ("{month}", MONTHS_FULL[day.month - 1].lower()),
        ("{MonthFull}", MONTHS_FULL[day.month - 1]),
        ("{Day0D}", f"{day.day:02d}"),
    ):
        template = template.replace(key, value, 1)
    return template


def _nth_next_month(now: dt.datetime, n: int) -> dt.datetime:
    return dt.datetime(now.year + (now.month == 12), now.month % 12 + 1, n)


def relative_day(name: str, now: dt.datetime, role: str, other: str | None = None) -> dt.datetime:
    """The day a relative name means, as OSWorld computes it (``role``: ``from``/``to``/``time``).

    A name OSWorld's branch for that role does not handle raises (there: an unbound variable).
    """
    if name == "tomorrow":
        return now + dt.timedelta(days=1)
    if name in ("5th next month", "10th next month", "11th next month"):
        allowed = {"time": ("5th next month", "10th next month"), "from": ("10th next month",),
                   "to": ("11th next month",)}[role]  # fmt: skip
        if name in allowed:
            return _nth_next_month(now, int(name.split("th")[0]))
    if name == "this month" and role == "time":
        return now
    if name == "next Monday" and role in ("time", "from"):
        return now + dt.timedelta(days=(6 - now.weekday()) + 1)
    if name == "first monday four months later" and role == "time":
        # OSWorld's arithmetic as written: the month is (m + 4) % 12 (0 in August raises there too)
        first = dt.datetime(now.year + (now.month >= 9), (now.month + 4) % 12, 1)
        return first + dt.timedelta(days=((6 - first.weekday()) + 1) % 7)
    if name == "this Saturday" and role == "from":
        return now + dt.timedelta(days=5 - now.weekday())
    if name == "this Sunday" and role == "to":
        return now + dt.timedelta(days=6 - now.weekday())
    if name == "next Friday" and role == "to":
        if now.weekday() < 4 and other == "next Monday":
            return now + dt.timedelta(days=(4 - now.weekday()) + 7)
        return now + dt.timedelta(days=(4 - now.weekday()) if now.weekday() < 4 else (6 - now.weekday()) + 5)
    raise ValueError(f"rule_relativeTime: {name!r} is not handled for {role!r}")


def get_rule_relativeTime(ctx: EpisodeContext, config: dict[str, Any], now: dt.datetime | None = None) -> Any:  # noqa: N802
    """The ``rules`` with their ``expected`` date templates filled in for today (``relativeTime``:
    ``from``, optionally ``to``)."""
    now = now or dt.datetime.now()
    rules = json.loads(json.dumps(config["rules"]))  # OSWorld edits the task's config; a copy here
    rel, expected = rules["relativeTime"], rules["expected"]
    if "to" not in rel:
        expected["time"] = format_day(expected["time"], relative_day(rel["from"], now, "time"))
    else:
        expected["from"] = format_day(expected["from"], relative_day(rel["from"], now, "from"))
        expected["to"] = format_day(expected["to"], relative_day(rel["to"], now, "to", rel["from"]))
    return rules


def get_vm_terminal_output(ctx: EpisodeContext, config: dict[str, Any]) -> str | None:
    """The focused GNOME Terminal's text, right-stripped (None: no terminal open and active).

    OSWorld's getter asks the VM server's ``/terminal`` (here ``terminal.py``, over AT-SPI).
    """
    return ctx.client.terminal_output()


def get_vm_wallpaper(ctx: EpisodeContext, config: dict[str, Any]) -> str | None:
    """The desktop background's file copied to ``<work_dir>/<dest>`` (None: the setting names no file).

    OSWorld's server reads GNOME's ``org.gnome.desktop.background picture-uri`` with gsettings.
    """
    data = ctx.client.wallpaper()
    if data is None:
        return None
    local = os.path.join(ctx.work_dir, os.path.basename(config["dest"]))
    with open(local, "wb") as f:
        f.write(data)
    return local


GETTERS: dict[str, Callable[[EpisodeContext, dict[str, Any]], Any]] = {
    "vm_terminal_output": get_vm_terminal_output,
    "vm_wallpaper": get_vm_wallpaper,
    "new_startup_page": get_new_startup_page,
    "find_unpacked_extension_path": get_find_unpacked_extension_path,
    "find_installed_extension_name": get_find_installed_extension_name,
    "active_tab_html_parse": get_active_tab_html_parse,
    "pdf_from_url": get_pdf_from_url,
    "vscode_config": get_vscode_config,
    "audio_in_slide": get_audio_in_slide,
    "background_image_in_slide": get_background_image_in_slide,
    "content_from_vm_file": get_content_from_vm_file,
    "default_video_player": get_default_video_player,
    "time_diff_range": get_time_diff_range,
    "rule_relativeTime": get_rule_relativeTime,
}
