"""Per-episode command wrappers put first on the desktop's ``PATH``.

(``google-chrome`` lives in ``chrome.py``.)

- ``sudo``: the desktop has no root to become (and ``no_new_privs`` stops a real sudo); it strips
  sudo's options and runs the command as the desktop user, so tasks' ``echo password | sudo -S cmd``
  still runs ``cmd`` (what needs root then fails, as on a read-only system);
- ``vlc``: VLC with the HTTP interface OSWorld's VM configures (``127.0.0.1:8080``, password
  ``password``), which the ``vlc_playing_info`` getter reads from inside the desktop, and without
  the first-run privacy dialog (answered on OSWorld's VM);
- ``apt``/``apt-get``: the desktop has no network and a read-only system. Tasks' setups install
  what their scoring needs (``sudo apt-get install -y unzip && unzip ...``); on the VM that
  succeeds, so here ``update`` succeeds and ``install`` succeeds when every package named is
  installed on the host (the list is written next to the wrapper), and fails with apt's status
  100 naming the missing ones otherwise, as an offline apt would;
- ``pip``/``pip3``: likewise for the Python packages tasks pip-install (``pip install pygame``): on
  the VM pip fetches them from PyPI; here ``install`` succeeds when every requirement named is
  installed in the desktop's Python (the host's, where ``scripts/install.sh --osworld-apps`` put
  the tasks' packages from the package index, honouring the machine's pip configuration) and fails
  with pip's status 1 naming the missing ones otherwise; other pip commands run pip itself.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import lru_cache
from importlib import metadata

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


@lru_cache(maxsize=1)
def installed_packages() -> tuple[str, ...]:
    """The Debian packages installed on this host (empty where there is no dpkg)."""
    if shutil.which("dpkg-query") is None:
        return ()
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\\n"], capture_output=True, text=True
    ).stdout
    return tuple(sorted(line.split()[0] for line in out.splitlines() if line.endswith(" installed")))


APT_SCRIPT = """list="$(dirname "$0")/.installed-packages"
cmd=""; pkgs=""
for a in "$@"; do
  case "$a" in -*) ;; *) if [ -z "$cmd" ]; then cmd="$a"; else pkgs="$pkgs $a"; fi ;; esac
done
case "$cmd" in
  update) echo "Reading package lists... Done"; exit 0 ;;
  install)
    missing=""
    for p in $pkgs; do grep -qxF "${p%%[=:]*}" "$list" || missing="$missing $p"; done
    if [ -z "$missing" ]; then
      for p in $pkgs; do echo "$p is already the newest version."; done
      exit 0
    fi
    echo "E: Unable to locate package$missing (no network on this desktop)" >&2; exit 100 ;;
  *) echo "E: '$cmd' is not available on this desktop (no network, read-only system)" >&2; exit 100 ;;
esac
"""


def write_apt_wrappers(bin_dir: str) -> list[str]:
    """``apt`` and ``apt-get`` that succeed for packages installed on the host (see the module doc)."""
    with open(os.path.join(bin_dir, ".installed-packages"), "w") as f:
        f.write("".join(f"{p}\n" for p in installed_packages()))
    return [_write_script(os.path.join(bin_dir, name), APT_SCRIPT) for name in ("apt", "apt-get")]


# pip's options that take a value (the next word is not a requirement).
PIP_VALUE_OPTIONS = {
    "-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-t", "--target", "--prefix", "--root",
    "-c", "--constraint", "-r", "--requirement", "--trusted-host", "--platform", "--python-version",
    "--implementation", "--abi", "--src", "--upgrade-strategy", "--progress-bar", "--timeout", "--retries",
    "--proxy", "--cert", "--client-cert", "--cache-dir", "--log", "-e", "--editable",
}  # fmt: skip


PIP_SOURCE_OPTIONS = {"-r", "--requirement", "-e", "--editable"}  # names no distribution by itself


def pip_requirements(args: list[str]) -> list[str]:
    """The distribution names a ``pip install`` argument list (after ``install``) names; a requirements
    file or an editable source is kept as ``"-r FILE"`` / ``"-e PATH"``: offline it cannot be checked,
    so it never counts as installed."""
    names, skip = [], ""
    for arg in args:
        if skip:
            if skip in PIP_SOURCE_OPTIONS:
                names.append(f"{skip} {arg}")
            skip = ""
        elif arg.startswith("-"):
            skip = arg if arg in PIP_VALUE_OPTIONS else ""
        elif "/" in arg or arg.startswith("."):  # a local path or URL, not a name on the index
            names.append(arg)
        else:
            names.append(re.split(r"[<>=!~\[;@ ]", arg, maxsplit=1)[0])
    return [n for n in names if n]


def missing_pip_packages(names: list[str]) -> list[str]:
    """Those of ``names`` not installed in this Python (the desktop's: ``python`` is ``sys.executable``)."""
    missing = []
    for name in names:
        try:
            metadata.distribution(name)
        except (metadata.PackageNotFoundError, ValueError):  # ValueError: not a distribution name
            missing.append(name)
    return missing


PIP_INSTALL_PY = """import sys
from rz_agents.envs.osworld.providers.wrappers import missing_pip_packages, pip_requirements
names = pip_requirements(sys.argv[2:])
missing = missing_pip_packages(names)
if missing:
    sys.stderr.write("ERROR: Could not find a version that satisfies the requirement " + " ".join(missing)
                     + " (no network on this desktop; scripts/install.sh --osworld-apps installs the"
                     + " packages OSWorld's tasks pip-install)\\n")
    sys.exit(1)
for name in names:
    print("Requirement already satisfied: " + name)
"""
PIP_SCRIPT = """case "$1" in
  install) exec python "$(dirname "$0")/.pip-install.py" "$@" ;;
  *) exec python -m pip "$@" ;;
esac
"""


def write_pip_wrappers(bin_dir: str) -> list[str]:
    """``pip`` and ``pip3`` whose ``install`` succeeds for packages the desktop's Python has (module doc)."""
    with open(os.path.join(bin_dir, ".pip-install.py"), "w") as f:
        f.write(PIP_INSTALL_PY)
    return [_write_script(os.path.join(bin_dir, name), PIP_SCRIPT) for name in ("pip", "pip3")]
