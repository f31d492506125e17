"""Who may call `rz serve`, against a real server on 127.0.0.1 (uvicorn, a tiny model): API keys on every
route, the RL control routes only behind their own key and never on the server an agent under training talks
to, sessions a second client cannot read, write or delete, browser-borne requests refused, and each cap and
timeout enforced."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import httpx
import pytest
import torch
from serve_fixtures import CONTROL_KEY, MODEL, Served

from rz_agents.serve import OpenAIServer, ServeOptions, SessionPolicy, start_in_loop
from rz_agents.serve.options import warn_if_exposed

KEYS = ("key-one", "key-two")
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
ROUTES = [
    ("GET", "/health", None),
    ("GET", "/metrics", None),
    ("GET", "/v1/models", None),
    ("GET", f"/v1/models/{MODEL}", None),
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": [1, 2], "max_tokens": 2}),
    ("POST", "/sessions/s/v1/chat/completions", CHAT),
    ("POST", "/v1/sessions", None),
    ("GET", "/v1/sessions/s", None),
    ("DELETE", "/v1/sessions/s", None),
    ("POST", "/pause", None),
    ("POST", "/resume", None),
    ("GET", "/is_paused", None),
    ("GET", "/weight_version", None),
    ("POST", "/update_weights", {"path": "/etc/passwd", "version": 1}),
    ("GET", "/no/such/route", None),
]


@pytest.fixture(scope="module")
def served():
    s = Served(taught=False, control=True, api_keys=KEYS, max_request_sequences=8, max_body_bytes=4096)
    yield s
    s.stop()


def _call(served, method, path, body=None, key: str | None = KEYS[0], **kw) -> httpx.Response:
    headers = dict(kw.pop("headers", {}))
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.request(
        method, f"{served.http.root}{path}", json=body, headers=headers, timeout=kw.pop("timeout", 30), **kw
    )


@pytest.mark.parametrize("method,path,body", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_every_route_needs_a_key(served, method, path, body):
    for key in (None, "wrong-key"):
        r = _call(served, method, path, body, key=key)
        assert r.status_code == 401, (key, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
    assert served.engine.stats()["running"] == 0 and not served.engine.is_paused


def test_a_key_opens_the_openai_routes_but_not_the_control_routes(served):
    assert _call(served, "GET", "/health").status_code == 200
    assert _call(served, "POST", "/v1/chat/completions", CHAT, key=KEYS[1]).status_code == 200
    assert _call(served, "GET", f"/v1/models/{MODEL}").json()["id"] == MODEL
    for key in KEYS:  # an API key is not the control key
        assert _call(served, "POST", "/pause", key=key, params={"mode": "keep"}).status_code == 401
    assert not served.engine.is_paused
    assert _call(served, "GET", "/weight_version", key=CONTROL_KEY).json() == {"version": 0}
    assert _call(served, "GET", "/v1/models", key=CONTROL_KEY).status_code == 401  # and the other way round


def test_the_control_routes_are_absent_unless_asked_for(tmp_path):
    s = Served(taught=False)  # the default: no control
    try:
        for method, path, body in ROUTES[-6:-1]:
            r = _call(s, method, path, body, key=CONTROL_KEY)
            assert r.status_code == 404, (path, r.text)
        assert not s.engine.is_paused and s.engine.version == 0
    finally:
        s.stop()


def test_the_training_envs_in_loop_server_has_no_control_routes():
    """``start_in_loop`` is what envs/openai_agent serves each episode's agent from."""
    s = Served(taught=False)
    s.stop()  # only its engine and OpenAIServer: the in-loop server below runs on this test's loop
    server = OpenAIServer(s.engine, s.tokenizer, s.template, model_name=MODEL)

    async def probe():
        http = await start_in_loop(server)
        try:
            async with httpx.AsyncClient(base_url=http.root, timeout=30) as client:
                return [
                    (await client.request(m, p, json=b, headers={"Authorization": f"Bearer {CONTROL_KEY}"}))
                    for m, p, b in ROUTES[-6:-1]
                ]
        finally:
            await http.stop()

    answers = asyncio.run(probe())
    assert [r.status_code for r in answers] == [404] * 5
    assert not s.engine.is_paused and s.engine.version == 0


def _converse(served, key, session, turns=2):
    messages = [{"role": "user", "content": "hello"}]
    for _ in range(turns):
        r = _call(served, "POST", "/v1/chat/completions", {**CHAT, "messages": messages}, key=key,
                  headers={"X-RZ-Session": session})  # fmt: skip
        assert r.status_code == 200, r.text
        messages += [r.json()["choices"][0]["message"], {"role": "user", "content": "more"}]


def test_a_second_client_cannot_read_write_or_delete_a_session_it_did_not_open(served):
    _converse(served, KEYS[0], "mine")
    mine = _call(served, "GET", "/v1/sessions/mine").json()
    assert mine["turns"] == 2
    assert _call(served, "GET", "/v1/sessions/mine", key=KEYS[1]).status_code == 404
    assert _call(served, "DELETE", "/v1/sessions/mine", key=KEYS[1]).status_code == 404
    _converse(served, KEYS[1], "mine", turns=1)  # the same name under another key: its own session
    assert _call(served, "GET", "/v1/sessions/mine", key=KEYS[1]).json()["turns"] == 1
    assert _call(served, "GET", "/v1/sessions/mine").json() == mine  # untouched
    assert _call(served, "DELETE", "/v1/sessions/mine").json()["deleted"]


def test_server_issued_session_ids_are_unguessable_and_owned(served):
    ids = {_call(served, "POST", "/v1/sessions").json()["id"] for _ in range(3)}
    assert len(ids) == 3 and all(len(i) >= 32 for i in ids)
    sid = ids.pop()
    _converse(served, KEYS[0], sid, turns=1)
    assert _call(served, "GET", f"/v1/sessions/{sid}").json()["turns"] == 1
    assert _call(served, "GET", f"/v1/sessions/{sid}", key=KEYS[1]).status_code == 404


@pytest.fixture(scope="module")
def keyless():
    """Like the training env's in-loop server: loopback, no keys, the default options."""
    s = Served(taught=False, session_records=False)
    yield s
    s.stop()


@pytest.mark.parametrize("keyed", [False, True])
def test_an_episode_reaches_only_its_own_session_through_its_capability(served, keyless, keyed):
    s = served if keyed else keyless
    key = KEYS[0] if keyed else None
    store = s.server.sessions
    policy = SessionPolicy(temperature=1.0, top_k=0, top_p=1.0, seed=0, max_tokens_per_turn=4,
                           max_session_tokens=400)  # fmt: skip
    a, b = store.open("episode-0-0-0", policy), store.open("episode-0-1-0", policy)
    try:
        url_a = s.http.session_url("episode-0-0-0")
        assert a.capability in url_a and "episode" not in url_a
        r = httpx.post(f"{url_a}/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200 and a.turns == 1
        for name in ("episode-0-1-0", "episode-0-0-0"):  # by id, whatever the route: never the episode's
            r = _call(s, "POST", f"/sessions/{name}/v1/chat/completions", CHAT, key=key)
            if keyed:  # the name is looked up in the key's own namespace: a session of the client's own
                assert r.status_code == 200
            else:
                assert r.status_code == 403 and r.json()["error"]["code"] == "session_not_owned"
            r = _call(s, "POST", "/v1/chat/completions", CHAT, key=key, headers={"X-RZ-Session": name})
            assert r.status_code == (200 if keyed else 403)
            if keyed:  # what it reads and deletes is its own session of that name
                assert _call(s, "GET", f"/v1/sessions/{name}", key=key).json()["turns"] == 2
                assert _call(s, "DELETE", f"/v1/sessions/{name}", key=key).status_code == 200
            else:
                assert _call(s, "GET", f"/v1/sessions/{name}", key=key).status_code == 404
                assert _call(s, "DELETE", f"/v1/sessions/{name}", key=key).status_code == 403
        assert b.turns == 0 and a.turns == 1 and store.sessions["episode-0-1-0"] is b
    finally:
        store.close("episode-0-0-0")
        store.close("episode-0-1-0")
    assert a.capability not in store.capabilities


def test_session_records_are_not_readable_unless_enabled(keyless):
    _converse(keyless, None, "quiet", turns=1)
    assert httpx.get(f"{keyless.http.root}/v1/sessions/quiet").status_code == 404
    assert keyless.server.sessions.sessions["quiet"].turns == 1


@pytest.fixture(scope="module")
def keyed_quiet():
    """Keys, and session records off server-wide (the default)."""
    s = Served(taught=False, api_keys=KEYS, session_records=False)
    yield s
    s.stop()


def test_a_session_owner_opts_in_to_reading_its_own_records_per_session(keyed_quiet):
    s = keyed_quiet
    opted = _call(s, "POST", "/v1/sessions", {"records": True}).json()
    assert opted["records"] is True
    plain = _call(s, "POST", "/v1/sessions").json()["id"]  # no body: records stay off
    for sid in (opted["id"], plain):
        _converse(s, KEYS[0], sid, turns=1)
    record = _call(s, "GET", f"/v1/sessions/{opted['id']}").json()
    assert record["turns"] == 1 and sum(record["loss_mask"]) > 0 and record["id"] == opted["id"]
    off = _call(s, "GET", f"/v1/sessions/{plain}")
    assert off.status_code == 404 and off.json()["error"]["code"] == "session_records_disabled"
    # another key naming the opted-in id reaches only its own namespace; an unknown name answers the same
    for key, name in ((KEYS[1], opted["id"]), (KEYS[0], "never-opened")):
        r = _call(s, "GET", f"/v1/sessions/{name}", key=key)
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_records_disabled"
    for body in ({"records": "yes"}, {"records": True, "other": 1}, [1]):
        r = _call(s, "POST", "/v1/sessions", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "records"


def test_a_cross_site_text_plain_post_and_a_foreign_host_are_refused(served):
    plain = {"Content-Type": "text/plain", "Authorization": f"Bearer {KEYS[0]}"}
    r = httpx.post(f"{served.http.root}/v1/chat/completions", content=b'{"model": "x"}', headers=plain)
    assert r.status_code == 415 and r.json()["error"]["code"] == "bad_content_type"
    evil = _call(served, "POST", "/v1/chat/completions", CHAT, headers={"Origin": "http://evil.example"})
    assert evil.status_code == 403 and evil.json()["error"]["code"] == "origin_not_allowed"
    rebound = _call(served, "GET", "/v1/models", headers={"Host": f"evil.example:{served.http.port}"})
    assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "host_not_allowed"
    own = f"http://127.0.0.1:{served.http.port}"
    assert _call(served, "GET", "/v1/models", headers={"Origin": own}).status_code == 200
    assert (
        _call(served, "GET", "/v1/models", headers={"Host": f"localhost:{served.http.port}"}).status_code
        == 200
    )
    assert served.server.counters["chat_requests"] >= 0 and not served.engine.is_paused


def test_an_allow_list_adds_hosts_and_origins():
    s = Served(taught=False, allowed_hosts=("rz.internal",), allowed_origins=("http://ui.internal",))
    try:
        ok = httpx.get(
            f"{s.http.root}/v1/models", headers={"Host": "rz.internal", "Origin": "http://ui.internal"}
        )
        assert ok.status_code == 200
        assert httpx.get(f"{s.http.root}/v1/models", headers={"Host": "other.internal"}).status_code == 403
    finally:
        s.stop()


def test_body_size_and_sequence_caps(served):
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    r = _call(served, "POST", "/v1/chat/completions", big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

    def chunked():
        yield b'{"model": "' + b"x" * 3000
        yield b"y" * 3000 + b'"}'

    headers = {"Authorization": f"Bearer {KEYS[0]}", "Content-Type": "application/json"}
    r = httpx.post(f"{served.http.root}/v1/completions", content=chunked(), headers=headers)
    assert r.status_code == 413
    many = {"model": MODEL, "prompt": [[1, 2]] * 5, "n": 2, "max_tokens": 1}
    r = _call(served, "POST", "/v1/completions", many)
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_sequences"
    assert _call(served, "POST", "/v1/completions", {**many, "n": 1}).status_code == 200


def _raw(served, data: bytes) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", served.http.port), timeout=10)
    conn.sendall(data)
    return conn


def _closed_within(conn: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closes ``conn`` within ``seconds``; what it sent meanwhile."""
    conn.settimeout(seconds)
    got = b""
    try:
        while True:
            chunk = conn.recv(4096)
            if not chunk:
                return True, got
            got += chunk
    except TimeoutError:
        return False, got
    except ConnectionResetError:
        return True, got
    finally:
        conn.close()


@pytest.fixture(scope="module")
def hasty():
    s = Served(taught=False, header_timeout_s=0.5, body_timeout_s=0.5, idle_timeout_s=0.5)
    yield s
    s.stop()


def test_a_request_head_that_never_ends_is_closed(hasty):
    t0 = time.monotonic()
    closed, _ = _closed_within(
        _raw(hasty, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "), 5
    )
    assert closed and time.monotonic() - t0 < 3
    closed, _ = _closed_within(_raw(hasty, b""), 5)  # connects, sends nothing
    assert closed


def test_a_body_that_never_arrives_is_a_408(hasty):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{\"model\"")  # fmt: skip
    closed, got = _closed_within(_raw(hasty, head), 5)
    assert got.startswith(b"HTTP/1.1 408") and b'"timeout"' in got and closed


def test_an_idle_keep_alive_connection_is_closed(hasty):
    conn = _raw(hasty, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    t0 = time.monotonic()
    closed, got = _closed_within(conn, 5)
    assert got.startswith(b"HTTP/1.1 200") and closed and time.monotonic() - t0 < 3


def test_update_weights_versions_are_int64_and_monotonic_and_paths_confined(served, tmp_path):
    state = {k: v.clone() for k, v in served.learner_model.state_dict().items()}
    torch.save(state, tmp_path / "w.pt")
    body = {"path": str(tmp_path / "w.pt")}
    for version in (2**63, -1, 1.5, "3", True):
        r = _call(served, "POST", "/update_weights", {**body, "version": version}, key=CONTROL_KEY)
        assert r.status_code == 400 and r.json()["error"]["param"] == "version", version
    assert served.engine.version == 0
    assert (
        _call(served, "POST", "/update_weights", {**body, "version": 3}, key=CONTROL_KEY).status_code == 200
    )
    r = _call(served, "POST", "/update_weights", {**body, "version": 2}, key=CONTROL_KEY)
    assert r.status_code == 409 and served.engine.version == 3
    confined = served.control.weights_dir
    try:
        served.control.weights_dir = (tmp_path / "elsewhere").resolve()
        r = _call(served, "POST", "/update_weights", {**body, "version": 4}, key=CONTROL_KEY)
        assert r.status_code == 400 and served.engine.version == 3
    finally:
        served.control.weights_dir = confined
        served.http.call(_load(served.engine, state, 4))


async def _load(engine, state, version):
    engine.load_weights(state, version)


def test_binding_beyond_loopback_without_a_key_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="rz_agents.serve.options"):
        assert warn_if_exposed(ServeOptions(host="0.0.0.0"))
        assert not warn_if_exposed(ServeOptions(host="0.0.0.0", api_keys=("k",)))
        assert not warn_if_exposed(ServeOptions(host="127.0.0.1"))
    assert sum("without an API key" in r.getMessage() for r in caplog.records) == 1


def test_control_routes_without_their_own_key_are_refused_at_start():
    with pytest.raises(ValueError, match="their own key"):
        Served(taught=False, control=True, control_key=None)
    with pytest.raises(ValueError, match="differ from every API key"):
        ServeOptions(api_keys=("same",), control_key="same")
