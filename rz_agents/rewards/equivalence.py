"""Is a predicted answer mathematically equal to the gold one? Fast exact checks first, then
math-verify in a worker process bounded by our own timeout (safe from any thread)."""

from __future__ import annotations

import atexit
import functools
import json
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
from fractions import Fraction

from rz_agents.rewards.answer import normalize_answer

_PLAIN_NUMBER = re.compile(r"[+-]?\d{1,60}(\.\d{1,60})?|[+-]?\d{1,60}/\d{1,60}")


def _as_fraction(s: str) -> Fraction | None:
    # only short plain numbers: Fraction("1e999999999") would be a denial of service
    if _PLAIN_NUMBER.fullmatch(s):
        try:
            return Fraction(s)
        except (ValueError, ZeroDivisionError):
            return None
    frac = re.fullmatch(r"([+-]?)\\frac\{(\d{1,60})\}\{(\d{1,60})\}", s)
    if frac and int(frac.group(3)) != 0:
        value = Fraction(int(frac.group(2)), int(frac.group(3)))
        return -value if frac.group(1) == "-" else value
    return None


def quick_equal(pred: str, gold: str) -> bool | None:
    """Decide cheaply when possible: True/False for plain numbers or identical text, else None."""
    p, g = normalize_answer(pred), normalize_answer(gold)
    if p == g:
        return True
    fp, fg = _as_fraction(p), _as_fraction(g)
    if fp is not None and fg is not None:
        return fp == fg
    return None


class _VerifyProcess:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rz_agents.rewards.verify_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.ready = False

    def ask(self, payload: dict, deadline: float) -> dict | None:
        """Send one request; None if the deadline passes or the process died."""
        try:
            if not self.ready:
                if self._read_line(deadline + 60) is None:  # the first import of sympy is slow
                    return None
                self.ready = True
                deadline = max(deadline, time.monotonic() + 1)
            self.proc.stdin.write(json.dumps(payload) + "\n")
            self.proc.stdin.flush()
            return self._read_line(deadline)
        except (OSError, ValueError):
            return None

    def _read_line(self, deadline: float) -> dict | None:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


class MathVerifier:
    """Checks answer equivalence with math-verify in ``workers`` child processes.

    Safe to call from any thread. A check that exceeds ``timeout_s`` counts as not equal and its
    worker is replaced. Plain numbers and identical strings never reach math-verify.
    """

    def __init__(self, workers: int = 1, timeout_s: float = 5.0) -> None:
        if workers < 1 or timeout_s <= 0:
            raise ValueError(f"workers must be >= 1 and timeout_s > 0, got {workers}, {timeout_s}")
        self.timeout_s = timeout_s
        self._idle: queue.Queue[_VerifyProcess | None] = queue.Queue()
        for _ in range(workers):
            self._idle.put(None)  # started lazily: most checks are decided by quick_equal
        self._all: list[_VerifyProcess] = []
        self._lock = threading.Lock()
        self.timeouts = 0

    def equal(self, pred: str, gold: str, timeout_s: float | None = None) -> bool:
        """True when ``pred`` and ``gold`` denote the same mathematical object."""
        if not isinstance(pred, str) or not isinstance(gold, str):
            return False
        quick = quick_equal(pred, gold)
        if quick is not None:
            return quick
        if len(pred) > 2000 or len(gold) > 2000:
            return False
        worker = self._idle.get()
        try:
            if worker is None:
                worker = _VerifyProcess()
                with self._lock:
                    self._all.append(worker)
            reply = worker.ask({"pred": pred, "gold": gold}, time.monotonic() + (timeout_s or self.timeout_s))
            if reply is None:
                self.timeouts += 1
                worker.kill()
                with self._lock:
                    self._all.remove(worker)
                worker = None
                return False
            return bool(reply.get("equal"))
        finally:
            self._idle.put(worker)

    def close(self) -> None:
        """Stop the worker processes."""
        with self._lock:
            for worker in self._all:
                worker.kill()
            self._all.clear()


@functools.lru_cache(maxsize=1)
def default_verifier() -> MathVerifier:
    """A process-wide verifier (two workers), stopped at interpreter exit."""
    verifier = MathVerifier(workers=2)
    atexit.register(verifier.close)
    return verifier


def math_equal(pred: str, gold: str, timeout_s: float = 5.0) -> bool:
    """Whether ``pred`` equals ``gold`` mathematically (with the process-wide verifier)."""
    return default_verifier().equal(pred, gold, timeout_s=timeout_s)
