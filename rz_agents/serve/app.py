"""HTTP for ``OpenAIServer``: the FastAPI app, server-sent events, disconnects, errors; and two ways to run
it.

Routes: ``GET /v1/models``, ``GET /v1/models/{id}``, ``POST /v1/chat/completions``, ``POST
/v1/responses`` (responses.py), ``POST /v1/completions``; the same under ``/sessions/{ID}/v1/...`` (the
session named by the URL, so an unmodified client configured by ``OPENAI_BASE_URL`` records a session);
``POST /v1/sessions`` (a new session with a server-issued, unguessable id; ``{"records": true}`` makes its
token record readable to its owner), ``DELETE /v1/sessions/{ID}``, ``GET /v1/sessions/{ID}`` (a session's
token history: for a session opened with records, or any of the caller's with ``session_records``);
``GET /metrics``, ``GET /health``; the RL control routes (control.py) only when a ``control`` is given,
behind their own key.

Every request first passes ``RequestGuard`` (guard.py: key, Host, Origin, Content-Type, body cap). A session
a client names lives in the namespace of its API key; a session the server opened (a training episode's) is
reached only through its capability token (sessions.py), so an agent cannot reach another episode's.

Every error is OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with a 4xx status for
what the client sent. A client that disconnects before its answer cancels its request: its sequences leave
the engine and their pages are freed.

``ServerThread`` runs the app on its own event loop in a thread (tests, benchmarks, notebooks);
``start_in_loop`` runs it on the current event loop beside a training run's engine (agents/openai_api):
there it has the default options, so no control routes and no readable session records.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import secrets
import threading
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from rz_agents.serve.control import RLControl, add_control_routes
from rz_agents.serve.guard import OWNER_KEY, RequestGuard
from rz_agents.serve.json_body import parse_json, read_json
from rz_agents.serve.openai_schema import (
    SESSION_HEADER,
    ChatRequest,
    OpenAIError,
    parse_chat,
    parse_completion,
)
from rz_agents.serve.options import ServeOptions, warn_if_exposed
from rz_agents.serve.responses import chat_body, response_events, response_from_chat
from rz_agents.serve.server import OpenAIServer
from rz_agents.serve.uvicorn_server import uvicorn_server

log = logging.getLogger(__name__)

__all__ = ["InLoopServer", "ServerThread", "create_app", "read_json", "start_in_loop"]


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


def _sse_events(events, server: OpenAIServer):
    """Named server-sent events (the Responses API's stream: ``event: TYPE`` lines, no ``[DONE]``)."""

    async def lines():
        try:
            async for e in events:
                yield f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"
        except OpenAIError as e:
            yield f"event: error\ndata: {json.dumps({'type': 'error', **e.body()['error']})}\n\n"
        except asyncio.CancelledError:
            server.counters["disconnects"] += 1
            raise

    return lines()


def _owner(request: Request) -> str:
    return getattr(request.state, OWNER_KEY, "")


def _records_opt_in(raw: bytes) -> bool:
    """``POST /v1/sessions``' body: none, or ``{"records": true|false}`` (the owner's opt-in to reading the
    session's token record back)."""
    body = parse_json(raw) if raw.strip() else {}
    if not isinstance(body, dict) or set(body) - {"records"}:
        raise OpenAIError('the body of POST /v1/sessions takes only {"records": true|false}', "records")
    records = body.get("records", False)
    if not isinstance(records, bool):
        raise OpenAIError(f"'records' must be true or false, got {records!r}", "records")
    return records


def _readable(server: OpenAIServer, options: ServeOptions, find) -> str:
    """The id of the caller's session that ``find()`` resolves, if its token record may be read: any of the
    caller's with ``session_records``, else one its owner opened with ``{"records": true}``. Otherwise,
    whatever the name is (unknown, another's, an episode's), the same 404."""
    if options.session_records:
        return find()
    off = OpenAIError(
        'session records are off for this session (open it with POST /v1/sessions {"records": true}, '
        "or serve with --session-records)",
        "session",
        status=404,
        code="session_records_disabled",
    )
    try:
        owned = find()
    except OpenAIError:
        raise off from None
    if not server.sessions.sessions[owned].records:
        raise off
    return owned


def _check_sequences(count: int, options: ServeOptions) -> None:
    if count > options.max_request_sequences:
        raise OpenAIError(
            f"the request asks for {count} sequences (prompts x n); this server takes at most "
            f"{options.max_request_sequences} per request",
            "n",
            code="too_many_sequences",
        )


def create_app(server: OpenAIServer, control: RLControl | None = None, options: ServeOptions | None = None):
    """The ASGI app serving ``server``: the FastAPI app (``.app``) behind ``RequestGuard``.

    ``control``: mount the RL control routes for it (they need ``options.control_key``); None (the
    default, and what the training env's in-loop server uses) leaves them out.
    """
    options = options or ServeOptions()
    if control is not None and not options.control_key:
        raise ValueError("the RL control routes need their own key (ServeOptions.control_key, --control-key)")
    app = FastAPI(title="rz serve", docs_url=None, redoc_url=None)
    app.state.server = server
    app.state.options = options
    _add_error_handlers(app)
    _add_model_routes(app, server)
    _add_generation_routes(app, server, options)
    _add_session_routes(app, server, options)
    if control is not None:
        add_control_routes(app, control)
    return RequestGuard(app, options, control=control is not None)


def _add_error_handlers(app: FastAPI) -> None:
    """OpenAI-shaped error bodies for the server's own errors and for FastAPI's (404, 405, ...)."""

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, e: OpenAIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {e.detail}"
        return JSONResponse(OpenAIError(message, None, e.status_code, kind).body(), status_code=e.status_code)


def _add_model_routes(app: FastAPI, server: OpenAIServer) -> None:
    """Health, metrics and the model list (also under a session's base URL)."""

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

    @app.get("/v1/models/{model_id:path}")
    @app.get("/sessions/{session_id}/v1/models/{model_id:path}")
    async def model_card(model_id: str, session_id: str | None = None) -> dict:
        server.check_model(model_id)
        return server.models()["data"][0]


def _add_generation_routes(app: FastAPI, server: OpenAIServer, options: ServeOptions) -> None:
    """Chat completions, responses and completions (each also under a session's base URL)."""

    def chat_request(request: Request, body: Any, session_id: str | None) -> ChatRequest:
        req = parse_chat(body, session_id or request.headers.get(SESSION_HEADER), options.strict_fields)
        _check_sequences(req.sampling.n, options)
        if req.session is not None:
            req.session = server.sessions.resolve(req.session, _owner(request))
        return req

    async def chat(request: Request, session_id: str | None):
        req = chat_request(request, await read_json(request), session_id)
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

    @app.post("/v1/responses")
    @app.post("/sessions/{session_id}/v1/responses")
    async def responses(request: Request, session_id: str | None = None):
        body = await read_json(request)
        req = chat_request(request, chat_body(body), session_id)
        if req.sampling.stream:
            server.check_model(req.model)
            req.sampling.include_usage = True  # response.completed carries the usage
            chunks = server.chat_stream(req)
            first = await anext(chunks)  # raises the request's 4xx before the stream starts
            events = response_events(body, server.model_name, _chain(first, chunks))
            return StreamingResponse(_sse_events(events, server), media_type="text/event-stream")
        result = await _unless_disconnected(server, request, server.chat(req))
        return Response(status_code=499) if result is None else JSONResponse(response_from_chat(body, result))

    @app.post("/v1/completions")
    @app.post("/sessions/{session_id}/v1/completions")
    async def completions(request: Request, session_id: str | None = None):
        req = parse_completion(await read_json(request), options.strict_fields)
        _check_sequences(len(req.prompts) * req.sampling.n, options)
        if req.sampling.stream:
            raise OpenAIError("'stream' is supported on /v1/chat/completions only", "stream")
        body = await _unless_disconnected(server, request, server.complete(req))
        return Response(status_code=499) if body is None else JSONResponse(body)


def _add_session_routes(app: FastAPI, server: OpenAIServer, options: ServeOptions) -> None:
    """Client sessions: create, read (only with ``options.session_records``), close."""

    @app.post("/v1/sessions")
    async def session_new(request: Request) -> dict:
        records = _records_opt_in(await request.body())
        name = secrets.token_urlsafe(24)
        session = server.sessions.get(server.sessions.resolve(name, _owner(request)))
        session.records = records
        return {"id": name, "object": "session", "records": records}

    def _client_session(request: Request, name: str) -> str:
        session_id = server.sessions.resolve(name, _owner(request))
        if session_id not in server.sessions.sessions or server.sessions.sessions[session_id].capability:
            raise OpenAIError(f"no session {name!r}", "session", status=404, code="session_not_found")
        return session_id

    @app.get("/v1/sessions/{session_id}")
    async def session_record(request: Request, session_id: str) -> dict:
        find = functools.partial(_client_session, request, session_id)
        return {**server.session_record(_readable(server, options, find)), "id": session_id}

    @app.delete("/v1/sessions/{session_id}")
    async def session_close(request: Request, session_id: str) -> dict:
        record = server.session_record(_client_session(request, session_id))
        server.sessions.close(record["id"])
        return {"id": session_id, "deleted": True, "turns": record["turns"]}


def _bound_port(server) -> int:
    return server.servers[0].sockets[0].getsockname()[1]


class _Addresses:
    """The base URLs of a running server (``host`` and ``port`` set by the subclass)."""

    host: str
    port: int
    server: OpenAIServer

    @property
    def root(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The base URL for ``openai.OpenAI(base_url=...)`` (it ends in ``/v1``)."""
        return f"{self.root}/v1"

    def session_url(self, session_id: str) -> str:
        """A base URL whose requests all belong to ``session_id``: for a session the server opened
        (``SessionStore.open``) the URL carries its capability token, not its id."""
        capability = self.server.sessions.capability_of(session_id)
        return f"{self.root}/sessions/{capability or session_id}/v1"


class ServerThread(_Addresses):
    """The app on ``host:port`` (0: any free port), served from its own event loop in a daemon thread.

    ``url`` is the base URL for ``openai.OpenAI(base_url=...)`` (it ends in ``/v1``). The engine's steps
    run on that thread's loop; do not call the engine from another loop meanwhile.
    """

    def __init__(
        self,
        server: OpenAIServer,
        host: str = "127.0.0.1",
        port: int = 0,
        options: ServeOptions | None = None,
        control: RLControl | None = None,
    ) -> None:
        options = dataclasses.replace(options or ServeOptions(), host=host)
        warn_if_exposed(options)
        self.server = server
        self.host = host
        self._uvicorn = uvicorn_server(create_app(server, control, options), options, port)
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

    def __init__(self, server: OpenAIServer, uv, task: asyncio.Task, host: str) -> None:
        self.server = server
        self._uvicorn, self._task, self.host = uv, task, host
        self.port = _bound_port(uv)

    @property
    def running(self) -> bool:
        return not self._task.done()

    async def stop(self) -> None:
        self._uvicorn.should_exit = True
        await asyncio.gather(self._task, return_exceptions=True)


async def start_in_loop(
    server: OpenAIServer, host: str = "127.0.0.1", port: int = 0, options: ServeOptions | None = None
) -> InLoopServer:
    """Serve ``server`` from a task on the running event loop (the one its engine steps on), without the
    control routes (an agent under training talks to this server)."""
    options = dataclasses.replace(options or ServeOptions(), host=host)
    warn_if_exposed(options)
    uv = uvicorn_server(create_app(server, None, options), options, port)
    uv.config.setup_event_loop = lambda: None  # already in a loop
    task = asyncio.get_running_loop().create_task(uv.serve(), name="rz-serve")
    while not uv.started:
        if task.done():
            task.result()
            raise RuntimeError("rz serve: the server ended before it started")
        await asyncio.sleep(0.01)
    return InLoopServer(server, uv, task, host)
