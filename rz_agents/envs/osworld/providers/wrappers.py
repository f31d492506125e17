"""Per-episode command wrappers put first on the desktop's ``PATH`` (``google-chrome`` lives in ``chrome.py``).

- ``sudo``: the desktop has no root to become (and ``no_new_privs`` stops a real sudo); it strips
  sudo's options and runs the command as the desktop user, so tasks' ``echo password | sudo -S cmd``
  still runs ``cmd`` (what needs root then fails, as on a read-only system);
- ``vlc``: VLC with the HTTP interface OSWorld's VM configures (``127.0.0.1:8080``, password
  ``password``), which the ``vlc_playing_info`` getter reads from inside the desktop, and without
  the first-run privacy dialog (answered on OSWorld's VM).
"""

from __future__ import annotations

import os
import shutil

VLC_HTTP_ARGS = (
    "--extraintf",
    "http",
    "--http-host",
    "127.0.0.1",
    "--http-port",
    "8080",
    "--http-password",
    "password",
)
VLC_QUIET_ARGS = ("--no-qt-privacy-ask",)  # OSWorld's VM has answered VLC's first-run dialog


def _write_script(path: str, body: str) -> str:
    with open(path, "w") as f:
        f.write("#!/bin/sh\n# Generated per episode by rz_agents.envs.osworld.\n" + body)
    os.chmod(path, 0o755)
    return path


def write_sudo_shim(bin_dir: str) -> str:
    """A ``sudo`` that drops its options and runs the command."""
    return _write_script(
        os.path.join(bin_dir, "sudo"),
        'while [ $# -gt 0 ]; do case "$1" in -u|-g) shift 2;; -*) shift;; *) break;; esac; done\n'
        '[ $# -gt 0 ] && exec "$@"\n',
    )


def write_vlc_wrapper(bin_dir: str) -> str | None:
    """A ``vlc`` with the HTTP interface on; None when VLC is not installed."""
    vlc = shutil.which("vlc")
    if vlc is None:
        return None
    args = " ".join((*VLC_HTTP_ARGS, *VLC_QUIET_ARGS))
    return _write_script(os.path.join(bin_dir, "vlc"), f'exec "{vlc}" {args} "$@"\n')
