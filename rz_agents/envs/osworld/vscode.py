"""VS Code on the local desktop: code-server (VS Code's own workbench and server, from npm) behind a ``code``
command.

VS Code desktop is not in Debian. code-server (coder/code-server on npm, ``scripts/install.sh
--osworld-apps``) is VS Code's workbench served to a browser, with VS Code's CLI for extensions.
Each desktop gets a ``code`` wrapper (``write_code_wrapper``) that keeps VS Code desktop's places:

- settings in ``~/.config/Code/User`` (``settings.json``, ``keybindings.json``: code-server's
  ``--user-data-dir ~/.config/Code``), extensions in ``~/.vscode/extensions``;
- ``code --list-extensions`` / ``--install-extension X.vsix`` / ``--uninstall-extension`` run
  code-server's CLI on those folders;
- ``code [folder | file | x.code-workspace]`` starts the desktop's code-server once (loopback,
  no auth, port 8931 of the desktop's own network) and opens a Chromium app window on it: a
  folder or workspace as VS Code opens it, a file by opening its folder and then the file.

How it differs from VS Code desktop: the window is Chromium's (its title ends in ``code-server``,
not ``Visual Studio Code``; browser-reserved keys such as Ctrl+W close it), extensions come
from Open VSX when online (none here: only ``.vsix`` files install), and the version is
code-server's (VS Code 1.100 for code-server 4.100.3).
"""

from __future__ import annotations

import os
import shutil

CODE_SERVER_PORT = 8931
CLI_FLAGS = (
    "--list-extensions", "--show-versions", "--install-extension", "--uninstall-extension",
    "--locate-extension", "--category", "--version", "-v", "--help", "-h",
)  # fmt: skip


def code_server_binary() -> str | None:
    """code-server on this machine, or None."""
    return shutil.which("code-server")


def vscode_problem() -> str | None:
    """Why desktops here cannot run VS Code (None when they can)."""
    if not code_server_binary():
        return "VS Code is not in Debian: install code-server (bash scripts/install.sh --osworld-apps)"
    from rz_agents.envs.osworld.chrome import chromium_binary

    if not chromium_binary():
        return "code-server's window is a Chromium app window: apt-get install chromium"
    return None


def write_code_wrapper(bin_dir: str, chromium: str, port: int = CODE_SERVER_PORT) -> str | None:
    """Write the desktop's ``code`` command into ``bin_dir``; None without code-server or Chromium."""
    server = code_server_binary()
    if server is None or not chromium:
        return None
    from rz_agents.envs.osworld.chrome import CHROMIUM_FLAGS

    cli = "|".join(CLI_FLAGS)
    flags = " ".join(f"'{f}'" for f in CHROMIUM_FLAGS)
    script = f"""#!/bin/sh
# Generated per episode by rz_agents.envs.osworld: VS Code's `code` on code-server (see vscode.py).
CS="{server}"
RUN="${{XDG_RUNTIME_DIR:-/tmp}}"
DIRS="--config $RUN/code-server.yaml --user-data-dir $HOME/.config/Code --extensions-dir $HOME/.vscode/extensions"
mkdir -p "$HOME/.config/Code/User" "$HOME/.vscode/extensions"
for a do case "$a" in {cli}) exec "$CS" $DIRS "$@";; esac; done
URL="http://127.0.0.1:{port}/"
LOG="$RUN/code-server.log"
if ! python3 -c "import socket; socket.create_connection(('127.0.0.1', {port}), 1)" 2>/dev/null; then
  nohup "$CS" $DIRS --auth none --bind-addr 127.0.0.1:{port} --disable-telemetry --disable-update-check --disable-workspace-trust \\
    >"$LOG" 2>&1 &
  for i in $(seq 1 150); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', {port}), 1)" 2>/dev/null && break
    sleep 0.2
  done
fi
QUERY=""
FILE=""
for a do
  case "$a" in -*) continue;; esac
  p=$(realpath -m "$a")
  case "$p" in
    *.code-workspace) QUERY="?workspace=$p";;
    *) if [ -d "$p" ]; then QUERY="?folder=$p"; else QUERY="?folder=$(dirname "$p")"; FILE="$p"; fi;;
  esac
done
"{chromium}" {flags} --app="$URL$QUERY" --user-data-dir="$HOME/.cache/code-server-window" --class=Code \\
  --force-renderer-accessibility >"$RUN/code-window.log" 2>&1 &
if [ -n "$FILE" ]; then
  # the workbench's CLI reaches the open window once it is up: open the file in it
  for i in $(seq 1 100); do
    sock=$(ls -t "$RUN"/vscode-ipc-*.sock 2>/dev/null | head -n 1)
    if [ -n "$sock" ]; then VSCODE_IPC_HOOK_CLI="$sock" "$CS" --reuse-window "$FILE" >/dev/null 2>&1 && break; fi
    sleep 0.3
  done
fi
exit 0
"""  # noqa: E501 (the shell script as written to disk)
    path = os.path.join(bin_dir, "code")
    with open(path, "w") as f:
        f.write(script)
    os.chmod(path, 0o755)
    return path
