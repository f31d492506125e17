"""Pausing generation for a weight update (the RL control API: vLLM's pause_generation / resume_generation).

Three modes say what happens to the requests in flight when generation pauses:

- ``"abort"``: they finish at once with what they generated so far (finish_reason "cancelled"), their pages
  freed; the pause takes effect immediately.
- ``"wait"``: no new request starts; those running finish normally, then the engine is paused.
- ``"keep"``: they stay where they are (pages, tokens, K/V) and continue after ``resume``; a weight update
  in between applies to their later tokens exactly as an update between two steps does.

Requests that arrive while paused wait in the engine's queue and start after ``resume``. The gate is
checked by the engine's step loop between steps, so a pause never splits a step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

PauseMode = Literal["abort", "wait", "keep"]
PAUSE_MODES = ("abort", "wait", "keep")


class PauseGate:
    """Whether the step loop may run a step, and whether it may admit new requests."""

    def __init__(self) -> None:
        self.mode: PauseMode | None = None  # None: generating
        self._draining = False  # mode "wait" until the running requests are done
        self._open = asyncio.Event()
        self._open.set()
        self._drained = asyncio.Event()

    @property
    def paused(self) -> bool:
        """True once paused (for "wait": once the running requests finished)."""
        return self.mode is not None and not self._draining

    @property
    def holds_new_requests(self) -> bool:
        """True while new requests must stay queued (paused, or draining for "wait")."""
        return self.mode is not None

    def close(self, mode: PauseMode) -> None:
        """Start pausing in ``mode`` (the engine does the mode's work on its requests)."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
        self.mode = mode
        self._draining = mode == "wait"
        self._drained.clear()
        self._open.clear()

    def open(self) -> None:
        """Resume: steps and admissions go on."""
        self.mode = None
        self._draining = False
        self._drained.set()
        self._open.set()

    async def before_step(self, has_running_work: bool) -> None:
        """Called by the step loop before each step: returns when a step may run."""
        if self._draining and not has_running_work:
            self._draining = False  # "wait" is complete: paused from now on
            self._drained.set()
        if self.mode is not None and not self._draining:
            await self._open.wait()

    async def drained(self, has_running_work: Callable[[], bool]) -> None:
        """Returns once a "wait" pause has let its running requests finish (the step loop may have ended
        with the last of them, so the work left is also looked at here, every few milliseconds)."""
        while self._draining:
            if not has_running_work():
                self._draining = False
                self._drained.set()
                return
            try:
                await asyncio.wait_for(self._drained.wait(), timeout=0.01)
            except TimeoutError:
                pass
