"""HTTP for ``OpenAIServer``: the FastAPI app, server-sent events, disconnects, errors; and two ways to run
it.

Routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``; the same under
``/sessions/{ID}/v1/...`` (the session named by the URL, so an unmodified client configured by
``OPENAI_BASE_URL`` records a session); ``GET|DELETE /v1/sessions/{ID}`` (a session's token history);
``GET /metrics``, ``GET /health``; the RL control routes (control.py).

Every error is OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with a 4xx status for
what the client sent. A client that disconnects before its answer cancels its request: its sequences leave
the engine and their pages are freed.

``ServerThread`` runs the app on its own event loop in a thread (tests, benchmarks, notebooks);
``start_in_loop`` runs it on the current event loop beside a training run's engine (envs/openai_agent).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from rz_agents.serve.control import RLControl, add_control_routes
from rz_agents.serve.openai_schema import SESSION_HEADER, OpenAIError, parse_chat, parse_completion
from rz_agents.serve.server import OpenAIServer

log = logging.getLogger(__name__)


async def read_json(request) -> Any:
    """The request body as JSON; OpenAIError (400) when it is not."""
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise OpenAIError(f"We could not parse the JSON body of your request: {e}") from None


async def _until_disconnect(request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _unless_disconnected(server: OpenAIServer, request, coro):
    """``await coro``, cancelled when the client disconnects first (then None)."""
    work = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(_until_disconnect(request))
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        raise
    finally:
        watch.cancel()
    if work in done:
        return work.result()
    work.cancel()  # the engine frees the sequences' pages before its next step
    await asyncio.gather(work, return_exceptions=True)
    server.counters["disconnects"] += 1
    return None


async def _chain(first, rest):
    yield first
    async for item in rest:
        yield item


def _sse(chunks, server: OpenAIServer):
    async def events():
        try:
            async for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n"
        except OpenAIError as e:
            yield f"data: {json.dumps(e.body())}\n\n"
        except asyncio.CancelledError:
            server.counters["disconnects"] += 1
            raise
        yield "data: [DONE]\n\n"

    return events()


def create_app(server: OpenAIServer, control: RLControl | None = None):
    """The FastAPI app serving ``server`` (and the control API of its engine)."""
    app = FastAPI(title="rz serve", docs_url=None, redoc_url=None)
    app.state.server = server

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, e: OpenAIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {e.detail}"
        return JSONResponse(OpenAIError(message, None, e.status_code, kind).body(), status_code=e.status_code)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> dict:
        return server.metrics()

    @app.get("/v1/models")
    @app.get("/sessions/{session_id}/v1/models")
    async def models(session_id: str | None = None) -> dict:
        return server.models()

    async def chat(request: Request, session_id: str | None):
        req = parse_chat(await read_json(request), session_id or request.headers.get(SESSION_HEADER))
        if req.sampling.stream:
            server.check_model(req.model)
            chunks = server.chat_stream(req)
            first = await anext(chunks)  # raises the request's 4xx before the stream starts
            return StreamingResponse(_sse(_chain(first, chunks), server), media_type="text/event-stream")
        body = await _unless_disconnected(server, request, server.chat(req))
        return Response(status_code=499) if body is None else JSONResponse(body)

    @app.post("/v1/chat/completions")
    async def chat_plain(request: Request):
        return await chat(request, None)

    @app.post("/sessions/{session_id}/v1/chat/completions")
    async def chat_in_session(request: Request, session_id: str):
        return await chat(request, session_id)

    @app.post("/v1/completions")
    @app.post("/sessions/{session_id}/v1/completions")
    async def completions(request: Request, session_id: str | None = None):
        req = parse_completion(await read_json(request))
        if req.sampling.stream:
            raise OpenAIError("'stream' is supported on /v1/chat/completions only", "stream")
        body = await _unless_disconnected(server, request, server.complete(req))
        return Response(status_code=499) if body is None else JSONResponse(body)

    @app.get("/v1/sessions/{session_id}")
    async def session_record(session_id: str) -> dict:
        return server.session_record(session_id)

    @app.delete("/v1/sessions/{session_id}")
    async def session_close(session_id: str) -> dict:
        record = server.session_record(session_id)
        server.sessions.close(session_id)
        return {"id": session_id, "deleted": True, "turns": record["turns"]}

    add_control_routes(app, control or RLControl(server.engine))
    return app


def _uvicorn_server(app, host: str, port: int):
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off", access_log=False)
    return uvicorn.Server(config)


def _bound_port(server) -> int:
    return server.servers[0].sockets[0].getsockname()[1]


class _Addresses:
    """The base URLs of a running server (``host`` and ``port`` set by the subclass)."""

    host: str
    port: int

    @property
    def root(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The base URL for ``openai.OpenAI(base_url=...)`` (it ends in ``/v1``)."""
        return f"{self.root}/v1"

    def session_url(self, session_id: str) -> str:
        """A base URL whose requests all belong to ``session_id``."""
        return f"{self.root}/sessions/{session_id}/v1"


class ServerThread(_Addresses):
    """The app on ``host:port`` (0: any free port), served from its own event loop in a daemon thread.

    ``url`` is the base URL for ``openai.OpenAI(base_url=...)`` (it ends in ``/v1``). The engine's steps
    run on that thread's loop; do not call the engine from another loop meanwhile.
    """

    def __init__(self, server: OpenAIServer, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = server
        self.host = host
        self._uvicorn = _uvicorn_server(create_app(server), host, port)
        self._thread = threading.Thread(target=self._run, name="rz-serve", daemon=True)
        self.port = 0
        self.loop: asyncio.AbstractEventLoop | None = None

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._uvicorn.serve())
        finally:
            self.loop.close()

    def start(self, timeout_s: float = 30.0) -> ServerThread:
        """Start serving; returns once the socket accepts connections."""
        self._thread.start()
        for _ in range(int(timeout_s / 0.01)):
            if self._uvicorn.started:
                break
            if not self._thread.is_alive():
                raise RuntimeError("rz serve: the server thread ended before it started (port in use?)")
            threading.Event().wait(0.01)
        else:
            raise TimeoutError(f"rz serve did not start within {timeout_s} s")
        self.port = _bound_port(self._uvicorn)
        return self

    def call(self, coro, timeout_s: float | None = None):
        """Run ``coro`` on the server's event loop (where the engine lives) and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        """Stop serving and join the thread."""
        self._uvicorn.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class InLoopServer(_Addresses):
    """The app served by a task on the current event loop (``start_in_loop``)."""

    def __init__(self, server: OpenAIServer, uvicorn_server, task: asyncio.Task, host: str) -> None:
        self.server = server
        self._uvicorn, self._task, self.host = uvicorn_server, task, host
        self.port = _bound_port(uvicorn_server)

    @property
    def running(self) -> bool:
        return not self._task.done()

    async def stop(self) -> None:
        self._uvicorn.should_exit = True
        await asyncio.gather(self._task, return_exceptions=True)


async def start_in_loop(server: OpenAIServer, host: str = "127.0.0.1", port: int = 0) -> InLoopServer:
    """Serve ``server`` from a task on the running event loop (the one its engine steps on)."""
    uv = _uvicorn_server(create_app(server), host, port)
    uv.config.setup_event_loop = lambda: None  # already in a loop
    task = asyncio.get_running_loop().create_task(uv.serve(), name="rz-serve")
    while not uv.started:
        if task.done():
            task.result()
            raise RuntimeError("rz serve: the server ended before it started")
        await asyncio.sleep(0.01)
    return InLoopServer(server, uv, task, host)
