"""The in-VM server's commands: OSWorld VM paths mapped to this desktop, commands run to completion
(``python -c`` actions through the pre-started action runner) or launched detached."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
from typing import Any

VM_HOME = "/home/user"
COMMAND_TIMEOUT_S = 120


def map_path(path: str) -> str:
    """Map an OSWorld VM path (``/home/user/...``, ``~``) to this desktop's home."""
    home = os.environ.get("HOME", VM_HOME)
    path = os.path.expanduser(path)
    if home != VM_HOME and (path == VM_HOME or path.startswith(VM_HOME + "/")):
        path = home + path[len(VM_HOME) :]
    return path


def map_command(command: list[str] | str) -> list[str] | str:
    """Rewrite ``/home/user`` in a command when the home lives elsewhere; ``python`` -> this Python."""
    home = os.environ.get("HOME", VM_HOME)
    if isinstance(command, str):
        return command.replace(VM_HOME, home) if home != VM_HOME else command
    out = [c.replace(VM_HOME, home) if home != VM_HOME else c for c in command]
    if out and out[0] in ("python", "python3"):
        out[0] = sys.executable
    return out


class ActionRunner:
    """The server's handle on ``action_runner``: ``python -c CODE`` answered by a pre-started fork server."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the runner (it preloads in the background; the first request waits for it)."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "rz_agents.envs.osworld.action_runner"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            self._proc.stdout.readline()  # {"ready": true}
        return self._proc

    def run(self, code: str, timeout: float) -> dict[str, Any] | None:
        """The result of running ``code``, or None when the runner is unusable (caller falls back)."""
        with self._lock:
            try:
                proc = self._ensure()
                proc.stdin.write(json.dumps({"code": code, "timeout": timeout}) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
                if not line:
                    raise OSError("action runner exited")
                return {"status": "success", **json.loads(line)}
            except (OSError, ValueError):
                if self._proc is not None:
                    self._proc.kill()
                self._proc = None
                return None


_runner = ActionRunner()


def _python_c_code(command: list[str] | str, shell: bool) -> str | None:
    """The code of a ``python -c CODE`` argv for this desktop's Python (the form OSWorld uses for
    actions; ``map_command`` already turned a bare ``python``/``python3`` into it), else None.

    An explicit other interpreter (``/usr/bin/python3``) runs as asked.
    """
    if shell or not isinstance(command, list) or len(command) != 3 or command[1] != "-c":
        return None
    return command[2] if command[0] == sys.executable else None


def run_command(command: list[str] | str, shell: bool, timeout: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
    """Run a command to completion; never raises, the result says what happened."""
    command = map_command(command)
    code = _python_c_code(command, shell)
    if code is not None:
        result = _runner.run(code, timeout)
        if result is not None:
            return result
    if shell and isinstance(command, list):
        command = " ".join(shlex.quote(c) for c in command)
    if not shell and isinstance(command, str):
        command = shlex.split(command)
    try:
        proc = subprocess.run(
            command, shell=shell, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        return {
            "status": "success",
            "output": proc.stdout,
            "error": proc.stderr,
            "returncode": proc.returncode,
        }
    except subprocess.TimeoutExpired as exc:
        return {
            "status": "error",
            "output": exc.stdout or "",
            "error": f"timed out after {timeout}s",
            "returncode": -1,
        }
    except (OSError, ValueError) as exc:
        return {"status": "error", "output": "", "error": str(exc), "returncode": -1}


def launch(command: list[str] | str, shell: bool) -> dict[str, Any]:
    """Start a program detached (it outlives the request, not the episode)."""
    command = map_command(command)
    if (
        isinstance(command, list)
        and command
        and os.path.basename(command[0]) == "socat"
        and not shutil.which("socat")
    ):
        # OSWorld forwards the CDP port with socat; here Chrome already listens on the episode's port.
        return {"status": "success", "message": "socat skipped: CDP is exposed directly"}
    if not shell and isinstance(command, str):
        command = shlex.split(command)
    try:
        subprocess.Popen(
            command,
            shell=shell,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return {"status": "success", "message": "launched"}
    except (OSError, ValueError) as exc:
        return {"status": "error", "message": str(exc)}
