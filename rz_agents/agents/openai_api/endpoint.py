"""The ``rz serve`` endpoint an OpenAI-API agent's episodes talk to: one per engine, on the event loop the
engine steps on, started on first use and shared by every episode of the run (their requests batch)."""

from __future__ import annotations

import asyncio
import weakref

from rz_agents.serve import OpenAIServer, start_in_loop

# One endpoint per engine: every episode of a run shares it (their requests batch in the engine), on the
# event loop the engine steps on. Keyed weakly so a finished run's engine is not kept alive.
_ENDPOINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def served_endpoint(engine, tokenizer, template, model_name: str = "policy"):
    """The running ``rz serve`` endpoint of ``engine`` on this event loop (started on first use)."""
    loop = asyncio.get_running_loop()
    entry = _ENDPOINTS.get(engine)
    if entry is not None and entry[0] is loop and entry[1].running:
        return entry[1]
    lock = _start_locks.setdefault(loop, asyncio.Lock())
    async with lock:  # concurrent first episodes start one server
        entry = _ENDPOINTS.get(engine)
        if entry is not None and entry[0] is loop and entry[1].running:
            return entry[1]
        http = await start_in_loop(OpenAIServer(engine, tokenizer, template, model_name=model_name))
        _ENDPOINTS[engine] = (loop, http)
        return http


_start_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
