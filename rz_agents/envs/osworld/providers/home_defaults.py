"""Settings a fresh desktop home starts with: what OSWorld's VM image has already answered.

LibreOffice would otherwise show its tip of the day and a "what's new" bar (which moves every
widget down) on first start, and ask "Keep current format?" when a task's postconfig presses Ctrl+S on an
.xlsx/.docx/.pptx, so the file would not be saved and a correct episode would score 0. The entries go into
LibreOffice's user registry, which LibreOffice keeps and extends (metrics that read it, e.g. the autosave
interval, still see the agent's changes).

File types open as on Ubuntu's GNOME (the VM): PDFs in Document Viewer (evince), images in Image
Viewer (eog), videos in Videos (Totem), text, JSON and Python files in Text Editor (gedit; two
multi-app tasks start with a JSON file "opened"), where installed (a task asks to make VLC the
default video player: without Totem, VLC would already be it). Without a choice, ``xdg-open``
(the tasks' ``open`` step) takes the first handler it finds, here GIMP for PDFs and images.
"""

from __future__ import annotations

import os

LIBREOFFICE_REGISTRY = ".config/libreoffice/4/user/registrymodifications.xcu"
_ITEMS = (
    ("/org.openoffice.Office.Common/Save/Document", "WarnAlienFormat", "false"),
    ("/org.openoffice.Office.Common/Misc", "ShowTipOfTheDay", "false"),
    ("/org.openoffice.Office.Common/Misc", "FirstRun", "false"),
    # "what's new" appears when this is older than the running version: a version no release has
    ("/org.openoffice.Setup/Product", "ooSetupLastVersion", "99.9"),
)


MIMEAPPS = ".config/mimeapps.list"
VIDEO_MIME_TYPES = tuple(
    f"video/{t}"
    for t in (
        "3gp 3gpp 3gpp2 dv divx fli flv mp2t mp4 mp4v-es mpeg mpeg-system msvideo ogg quicktime vivo "
        "vnd.divx vnd.mpegurl vnd.rn-realvideo vnd.vivo webm x-anim x-avi x-flc x-fli x-flic x-flv x-m4v "
        "x-matroska x-mpeg x-mpeg2 x-ms-asf x-ms-wmv x-msvideo x-nsv x-ogm+ogg x-theora+ogg x-totem-stream"
    ).split()
)
APPLICATIONS_DIR = "/usr/share/applications"
# Ubuntu 22.04's defaults.list entries for the types the tasks open (desktop file per MIME type).
UBUNTU_DEFAULTS = {
    "application/pdf": "org.gnome.Evince.desktop",
    **{f"image/{t}": "org.gnome.eog.desktop" for t in ("jpeg", "png", "gif", "bmp", "webp", "tiff")},
    **{mime: "org.gnome.gedit.desktop" for mime in ("text/plain", "application/json", "text/x-python")},
    # every video type Totem declares (Ubuntu's defaults.list gives them all to Totem)
    **{mime: "org.gnome.Totem.desktop" for mime in VIDEO_MIME_TYPES},
}


def default_handlers(applications_dir: str = APPLICATIONS_DIR) -> dict[str, str]:
    """Ubuntu's default handler per MIME type, for the handlers installed here."""
    return {
        mime: desktop
        for mime, desktop in UBUNTU_DEFAULTS.items()
        if os.path.exists(os.path.join(applications_dir, desktop))
    }


def write_home_defaults(home: str) -> None:
    """Write the default settings into the episode's home folder (its ``/home/user``)."""
    handlers = default_handlers()
    if handlers:
        os.makedirs(os.path.join(home, ".config"), exist_ok=True)
        lines = "".join(f"{mime}={desktop}\n" for mime, desktop in handlers.items())
        with open(os.path.join(home, MIMEAPPS), "w") as f:
            f.write(f"[Default Applications]\n{lines}")
    path = os.path.join(home, LIBREOFFICE_REGISTRY)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    items = "".join(
        f'<item oor:path="{item}"><prop oor:name="{name}" oor:op="fuse"><value>{value}</value></prop>'
        '</item>\n'
        for item, name, value in _ITEMS
    )
    with open(path, "w") as f:
        f.write(
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<oor:items xmlns:oor="http://openoffice.org/2001/registry" '
            'xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">\n'
            f"{items}</oor:items>\n"
        )
