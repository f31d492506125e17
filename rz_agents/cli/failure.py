"""How a command that stops on an error ends: one line on the terminal, the traceback in a log file.

A run-stopping failure (every episode failing, a dead learner process, a missing dataset...) is
printed as ``rz train: error: RolloutFailure: ...`` with a non-zero exit status; its traceback goes to
the run directory's log (``run_dir/rz.log``), or to the terminal with ``--debug``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
LOG_NAME = "rz.log"


def attach_run_log(args: argparse.Namespace, run_dir: Path) -> Path:
    """Log rz_agents' messages to ``run_dir/rz.log``, and make it where a failure's traceback goes."""
    path = Path(run_dir) / LOG_NAME
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("rz_agents")
    logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    args.log_file = path
    args.log_handler = handler
    return path


def detach_run_log(args: argparse.Namespace) -> None:
    """Stop logging to the run's log file (the file stays)."""
    handler = getattr(args, "log_handler", None)
    if handler is not None:
        logging.getLogger("rz_agents").removeHandler(handler)
        handler.close()
        args.log_handler = None


def one_line(exc: BaseException, limit: int = 400) -> str:
    """``Type: first line of the message``, cut to ``limit`` characters."""
    message = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_command(func: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """Run a subcommand; an exception it raises becomes one error line and exit status 1."""
    command = f"rz {getattr(args, 'command', '') or ''}".strip()
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print(f"\n{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if getattr(args, "debug", False):
            raise
        log_file = getattr(args, "log_file", None)
        where = "--debug shows the traceback"
        if log_file is not None:
            try:
                with open(log_file, "a") as f:
                    f.write(f"{command} stopped on an error:\n{traceback.format_exc()}")
                where = f"traceback: {log_file}"
            except OSError:
                pass
        print(f"{command}: error: {one_line(exc)} ({where})", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        detach_run_log(args)
