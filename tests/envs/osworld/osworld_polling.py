"""Polling for the desktop tests: what a real app shows comes after a while, never at a known instant."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(fn: Callable[[], T], timeout_s: float = 30.0, interval_s: float = 0.5) -> T:
    """``fn()`` every ``interval_s`` until it returns something truthy or ``timeout_s`` has passed; its last
    value either way (the caller asserts on it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)
