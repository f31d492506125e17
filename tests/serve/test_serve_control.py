"""The RL control API over HTTP (vLLM's names) and in Python: pause with mode abort / wait / keep, resume, a
versioned weight update, the current version."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest
import torch
from serve_fixtures import CONTROL_KEY, MODEL, Served

from rz_agents.serve import RLControl

LONG = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 300, "return_token_ids": True}


@pytest.fixture(scope="module")
def served():
    s = Served(taught=False, control=True)
    yield s
    s.stop()


@pytest.fixture
def pool():
    with concurrent.futures.ThreadPoolExecutor(2) as p:
        yield p


def _url(served, path):
    return f"{served.http.root}{path}"


def _control(method: str, url: str, **kw) -> httpx.Response:
    """A request to a control route, with the control routes' own key."""
    return httpx.request(method, url, headers={"Authorization": f"Bearer {CONTROL_KEY}"}, timeout=60, **kw)


def _start_long(served, pool, body=LONG):
    fut = pool.submit(lambda: httpx.post(_url(served, "/v1/completions"), json=body, timeout=60).json())
    deadline = time.monotonic() + 20
    while served.engine.stats()["running"] == 0:  # wait until it decodes
        assert time.monotonic() < deadline and not fut.done()
        time.sleep(0.005)
    return fut


def _wait_paused(served):
    deadline = time.monotonic() + 10
    while not _control("GET", _url(served, "/is_paused")).json()["is_paused"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_pause_abort_ends_requests_in_flight_with_their_partial_output_and_holds_new_ones(served, pool):
    running = _start_long(served, pool)
    r = _control("POST", _url(served, "/pause"), params={"mode": "abort"})
    assert r.status_code == 200 and r.json()["paused"]
    choice = running.result(timeout=30)["choices"][0]
    assert choice["finish_reason"] == "abort" and 0 < len(choice["token_ids"]) < 300
    assert served.engine.stats()["kv_bytes_held"] == 0
    held = pool.submit(
        lambda: httpx.post(_url(served, "/v1/completions"), json={**LONG, "max_tokens": 4}).json()
    )
    time.sleep(0.3)
    assert not held.done()  # queued while paused
    _control("POST", _url(served, "/resume"))
    assert len(held.result(timeout=30)["choices"][0]["token_ids"]) == 4


def test_pause_keep_freezes_requests_in_flight_and_resume_continues_them(served, pool):
    running = _start_long(served, pool)
    _control("POST", _url(served, "/pause"), params={"mode": "keep"})
    assert _control("GET", _url(served, "/is_paused")).json() == {"is_paused": True}
    frozen = served.engine.counters["generated_tokens"]
    time.sleep(0.3)
    assert served.engine.counters["generated_tokens"] == frozen and not running.done()
    _control("POST", _url(served, "/resume"))
    choice = running.result(timeout=60)["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 300


def test_pause_wait_returns_once_requests_in_flight_have_finished(served, pool):
    running = _start_long(served, pool, {**LONG, "max_tokens": 120})
    r = _control("POST", _url(served, "/pause"), params={"mode": "wait"})
    assert r.status_code == 200 and served.engine.stats()["running"] == 0  # it finished before pause returned
    choice = running.result(timeout=30)["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 120
    _wait_paused(served)
    _control("POST", _url(served, "/resume"))
    assert _control("GET", _url(served, "/is_paused")).json() == {"is_paused": False}


def test_a_versioned_weight_update_over_http_tags_later_tokens_and_refuses_stale_or_bad_ones(
    served, tmp_path
):
    state = {k: v + 0.01 for k, v in served.learner_model.state_dict().items()}
    torch.save(state, tmp_path / "w.pt")
    r = _control("POST", _url(served, "/update_weights"), json={"path": str(tmp_path / "w.pt"), "version": 5})
    assert r.status_code == 200 and r.json() == {"version": 5}
    assert _control("GET", _url(served, "/weight_version")).json() == {"version": 5}
    out = httpx.post(_url(served, "/v1/completions"), json={**LONG, "max_tokens": 5}).json()
    assert out["choices"][0]["versions"] == [5] * 5
    stale = _control(
        "POST", _url(served, "/update_weights"), json={"path": str(tmp_path / "w.pt"), "version": 4}
    )
    assert stale.status_code == 409 and "older than" in stale.json()["error"]["message"]
    torch.save({"not.a.weight": torch.zeros(2)}, tmp_path / "bad.pt")
    bad = _control(
        "POST", _url(served, "/update_weights"), json={"path": str(tmp_path / "bad.pt"), "version": 6}
    )
    assert bad.status_code == 400 and "do not fit the model" in bad.json()["error"]["message"]
    answers = set()
    (tmp_path / "text.pt").write_text("secret first byte")
    for path in (tmp_path / "none", tmp_path, tmp_path / "text.pt"):  # missing, a directory, not weights
        r = _control("POST", _url(served, "/update_weights"), json={"path": str(path), "version": 6})
        assert r.status_code == 400 and "secret" not in r.text and "'s'" not in r.text
        answers.add(r.json()["error"]["message"].replace(str(path), "PATH"))
    assert len(answers) == 1  # the same answer whatever the reason: nothing learned about the file
    mode = _control("POST", _url(served, "/pause"), params={"mode": "later"})
    assert mode.status_code == 400 and mode.json()["error"]["param"] == "mode"


def test_the_python_control_api_is_the_same_operations(served):
    control = RLControl(served.engine)
    base = {k: v.clone() for k, v in served.learner_model.state_dict().items()}

    async def cycle():
        await control.pause("keep")
        paused = control.is_paused
        version = control.update_weights(base, control.version + 1)
        control.resume()
        return paused, version, control.is_paused

    paused, version, after = served.http.call(cycle())
    assert paused and not after and version == control.version == served.engine.version
