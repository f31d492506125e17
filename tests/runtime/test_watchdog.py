"""The run-loop watchdog: silence (no progress) for its timeout is an error with stacks, even when the event
loop itself is blocked; progress keeps it quiet."""

import asyncio
import logging
import time

import pytest

from rz_agents.runtime.watchdog import RunStalled, Watchdog


def _blocking_call_in_the_loop():
    time.sleep(0.8)  # e.g. a pipe to a dead child process, called from the event loop's thread


def test_a_blocked_event_loop_is_reported_at_once_and_the_run_fails_when_it_unblocks(tmp_path, caplog):
    dog = Watchdog(
        0.2, progress=lambda: 0, describe=lambda: "learner steps 3/10", dump_path=tmp_path / "s.txt"
    )

    async def run():
        dog.start(asyncio.current_task())
        try:
            _blocking_call_in_the_loop()
            await asyncio.sleep(5)  # the cancellation arrives here, once the loop runs again
        except asyncio.CancelledError:
            raise dog.error from None
        finally:
            dog.stop()

    with caplog.at_level(logging.ERROR, logger="rz_agents.runtime.watchdog"):
        with pytest.raises(RunStalled, match=r"no progress for \d+ s \(watchdog_s=0.2.*learner steps 3/10"):
            asyncio.run(run())
    # Logged from the watchdog's thread while the loop was still blocked: the stack shows where.
    assert "in _blocking_call_in_the_loop" in caplog.records[0].getMessage()
    assert "in run" in (tmp_path / "s.txt").read_text()


def test_progress_keeps_the_watchdog_quiet():
    ticks = [0]
    dog = Watchdog(0.3, progress=lambda: ticks[0], describe=lambda: "")

    async def run():
        dog.start(asyncio.current_task())
        for _ in range(12):  # 1.2 s of steady progress, 4x the timeout
            ticks[0] += 1
            await asyncio.sleep(0.1)
        dog.stop()

    asyncio.run(run())
    assert dog.error is None
