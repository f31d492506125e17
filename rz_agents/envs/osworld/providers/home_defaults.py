"""Settings a fresh desktop home starts with: what OSWorld's VM image has already answered.

LibreOffice would otherwise show its tip of the day and a "what's new" bar (which moves every
widget down) on first start, and ask "Keep current format?" when a task's postconfig presses Ctrl+S on an .xlsx/.docx/.pptx, so the file would not be
saved and a correct episode would score 0. The entries go into LibreOffice's user registry, which
LibreOffice keeps and extends (metrics that read it, e.g. the autosave interval, still see the
agent's changes).

File types open as on Ubuntu's GNOME (the VM): PDFs in Document Viewer (evince), images in Image
Viewer (eog), where installed. Without a choice, ``xdg-open`` (the tasks' ``open`` step) takes
the first handler it finds, here GIMP for both.
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
APPLICATIONS_DIR = "/usr/share/applications"
# Ubuntu 22.04's defaults.list entries for the types the tasks open (desktop file per MIME type).
UBUNTU_DEFAULTS = {
    "application/pdf": "org.gnome.Evince.desktop",
    **{f"image/{t}": "org.gnome.eog.desktop" for t in ("jpeg", "png", "gif", "bmp", "webp", "tiff")},
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
        f'<item oor:path="{item}"><prop oor:name="{name}" oor:op="fuse"><value>{value}</value></prop></item>\n'
        for item, name, value in _ITEMS
    )
    with open(path, "w") as f:
        f.write(
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<oor:items xmlns:oor="http://openoffice.org/2001/registry" '
            'xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">\n'
            f"{items}</oor:items>\n"
        )
