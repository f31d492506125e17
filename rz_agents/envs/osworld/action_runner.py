"""A pre-started Python that runs each action in a fork of itself: ``python -c`` without the start-up.

Agent actions and many setup steps are ``python -c "import pyautogui; ..."``. Starting an
interpreter and importing pyautogui's dependencies costs a few hundred milliseconds per action;
this process pays it once. Each request forks a child that runs the code in a fresh ``__main__``
namespace (no state leaks between actions, as with ``python -c``), its stdout/stderr captured.

pyautogui itself is imported by the child, never here: it opens an X connection at import, and
a connection shared across forks would desynchronise the X protocol stream. mouseinfo (which
pyautogui imports) is preloaded with its connection deferred to first use (``preload_mouseinfo``).

Protocol: one JSON object per line on stdin ``{"code", "timeout"}``, one per line on stdout
``{"output", "error", "returncode"}``.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback

# Heavy, display-free modules pyautogui needs (mouseinfo and pyautogui open the display: not here).
PRELOAD = (
    "Xlib.display",
    "Xlib.X",
    "Xlib.XK",
    "Xlib.ext.xtest",
    "PIL.Image",
    "pyscreeze",
    "pytweening",
    "pymsgbox",
    "pyperclip",
)


def _child(code: str, out_fd: int, err_fd: int) -> None:
    """In the fork: run ``code`` as ``python -c`` would, then exit with its status."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    status = 0
    try:
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as exc:
        if isinstance(exc.code, int):
            status = exc.code
        elif exc.code is not None:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status & 0xFF)


def run_forked(code: str, timeout: float) -> dict:
    """Run ``code`` in a forked child; ``{"output", "error", "returncode"}`` (-9 and a note on timeout)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(code, out.fileno(), err.fileno())
        deadline = time.monotonic() + timeout
        status = None
        while status is None:
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(raw)
            elif time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = -9
            else:
                time.sleep(0.005)
        out.seek(0)
        err.seek(0)
        error = err.read().decode(errors="replace")
        if status == -9:
            error += f"\ntimed out after {timeout}s"
        return {"output": out.read().decode(errors="replace"), "error": error, "returncode": status}


class _DeferredDisplay:
    """Stands in for ``Xlib.display.Display`` while mouseinfo is preloaded: the X connection opens on
    first use, so in the child that uses it (its own connection), never in this process."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.__dict__["_open"] = lambda: _REAL_DISPLAY(*args, **kwargs)
        self.__dict__["_display"] = None

    def __getattr__(self, name: str) -> object:
        if self.__dict__["_display"] is None:
            self.__dict__["_display"] = self.__dict__["_open"]()
        return getattr(self.__dict__["_display"], name)


_REAL_DISPLAY = None


def preload_mouseinfo() -> bool:
    """Import mouseinfo here (pyautogui imports it at every action) with its module-level X connection
    deferred; True when it is preloaded.

    Its import runs ``which scrot`` in a subprocess and opens a display: ~27 of the ~32 ms of CPU an
    action's ``import pyautogui`` cost. Preloaded, the fork inherits the module with the ``which``
    answer, and a child that does use mouseinfo opens its own connection.
    """
    global _REAL_DISPLAY
    try:
        import Xlib.display
    except Exception:
        return False
    _REAL_DISPLAY = Xlib.display.Display
    Xlib.display.Display = _DeferredDisplay
    try:
        importlib.import_module("mouseinfo")
        return True
    except BaseException:  # noqa: BLE001 - mouseinfo may sys.exit (no tkinter): the child imports it itself
        sys.modules.pop("mouseinfo", None)
        return False
    finally:
        Xlib.display.Display = _REAL_DISPLAY


def xlib_extension_modules() -> list[str]:
    """The modules python-xlib imports for the server's extensions each time a ``Display`` opens.

    An action's ``import pyautogui`` opens a display, and that display imported and built the
    classes of ~15 extension modules: ~12 of the ~32 ms of CPU an action cost. Imported here once,
    the fork inherits them (plain modules: no X connection)."""
    try:
        import Xlib.ext
    except Exception:
        return []
    return [f"Xlib.ext.{module}" for _name, module in getattr(Xlib.ext, "__extensions__", [])]


def main() -> None:
    """Preload, then serve requests from stdin until it closes."""
    for name in (*PRELOAD, *xlib_extension_modules()):
        try:
            importlib.import_module(name)
        except Exception:
            pass  # the child's own import will report a real problem
    if os.environ.get("DISPLAY"):
        preload_mouseinfo()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            resp = run_forked(str(req["code"]), float(req.get("timeout", 120)))
        except Exception as exc:  # a bad request must not end the runner
            resp = {"output": "", "error": f"action runner: {type(exc).__name__}: {exc}", "returncode": -1}
        sys.stdout.write(json.dumps(resp) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
