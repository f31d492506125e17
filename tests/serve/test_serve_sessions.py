"""Token-exact sessions: a conversation's later requests append only their new messages' tokens, sampled
tokens stay as sampled with their log-probs and versions, a rewritten history is counted, sessions do not
see each other, and a session is a Trajectory the learner re-scores bit for bit."""

from __future__ import annotations

import concurrent.futures
import copy
import logging

import httpx
import pytest
import torch
from serve_fixtures import MODEL, Served, learner_logprobs

from rz_agents.engine.engine import RZEngine


@pytest.fixture(scope="module")
def served():
    s = Served()
    yield s
    s.stop()


def _turn(client, messages, **kw):
    r = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=10,
        logprobs=True,
        extra_body={"return_token_ids": True},
        **kw,
    )
    c = r.choices[0]
    return r.model_extra["prompt_token_ids"], c.model_extra["token_ids"], c


def _conversation(client, turns=3, seed=0, rewrite_at=None):
    """An agent loop written against the OpenAI SDK: it appends each reply and a new user message."""
    messages = [{"role": "user", "content": "hello"}]
    out = []
    for t in range(turns):
        if rewrite_at == t:
            messages[0] = {"role": "user", "content": "hello, rewritten"}
        prompt, ids, choice = _turn(client, messages, seed=seed + t)
        out.append((prompt, ids, choice))
        messages = messages + [
            choice.message.model_dump(exclude_none=True),
            {"role": "user", "content": f"more {t}"},
        ]
    return out


def _record(served, sid):
    return httpx.get(f"{served.http.root}/v1/sessions/{sid}").json()


def test_each_request_of_a_session_appends_only_its_new_tokens(served):
    store = served.server.sessions
    before = dict(store.counters)
    turns = _conversation(served.client(default_headers={"X-RZ-Session": "append"}))
    for (p1, ids1, _), (p2, _, _) in zip(turns, turns[1:], strict=False):
        assert p2[: len(p1) + len(ids1)] == p1 + ids1  # the history is the sampled tokens, never re-tokenized
    rec = _record(served, "append")
    last_prompt, last_ids, _ = turns[-1]
    assert rec["tokens"] == last_prompt + last_ids
    assert rec["prefix_mismatches"] == 0 and rec["turns"] == 3 and rec["segments"] == 1
    sampled = [t for t, m in zip(rec["tokens"], rec["loss_mask"], strict=True) if m]
    assert sampled == [t for _, ids, _ in turns for t in ids]
    logprobs = [lp for lp, m in zip(rec["behavior_logprobs"], rec["loss_mask"], strict=True) if m]
    assert logprobs == [e.logprob for _, _, c in turns for e in c.logprobs.content]
    assert all(v == 0 for v, m in zip(rec["versions"], rec["loss_mask"], strict=True) if m)
    assert store.counters["appended_requests"] - before["appended_requests"] == 2
    assert store.counters["prefix_mismatches"] == before["prefix_mismatches"]


def test_a_session_can_be_named_by_metadata_or_by_the_url(served):
    import openai

    by_url = openai.OpenAI(base_url=f"{served.http.root}/sessions/by-url/v1", api_key="x", max_retries=0)
    _conversation(by_url, turns=2)
    assert _record(served, "by-url")["turns"] == 2
    client = served.client()
    messages = [{"role": "user", "content": "hi"}]
    _, ids, c = _turn(client, messages, metadata={"rz_session": "by-metadata"})
    assert _record(served, "by-metadata")["tokens"][-len(ids) :] == ids


def test_a_client_that_rewrites_history_starts_a_new_segment_and_keeps_the_old_one(served, caplog):
    store = served.server.sessions
    before = store.counters["prefix_mismatches"]
    with caplog.at_level(logging.INFO, logger="rz_agents.serve.sessions"):
        turns = _conversation(served.client(default_headers={"X-RZ-Session": "rewriter"}), rewrite_at=2)
    assert store.counters["prefix_mismatches"] == before + 1
    rec = _record(served, "rewriter")
    assert rec["prefix_mismatches"] == 1 and rec["segments"] == 2
    assert rec["sampled_tokens_dropped"] == 0
    (start,) = rec["segment_starts"]
    prompt, ids, _ = turns[2]
    assert rec["tokens"][start:] == prompt + ids  # the new segment: the rewritten history rendered afresh
    first_prompt, first_ids, _ = turns[0]
    assert rec["tokens"][: len(first_prompt) + len(first_ids)] == first_prompt + first_ids  # the old one kept
    sampled = sum(rec["loss_mask"])
    assert sampled == sum(len(t[1]) for t in turns)  # every sampled token is kept for training
    assert any("does not extend the session's history" in r.getMessage() for r in caplog.records)


def test_sessions_are_isolated_from_each_other(served):
    alone = _conversation(served.client(default_headers={"X-RZ-Session": "alone"}), seed=11)

    def run(sid, seed):
        return _conversation(served.client(default_headers={"X-RZ-Session": sid}), seed=seed)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a, b = pool.map(run, ["twin", "other"], [11, 50])
    assert [x[:2] for x in a] == [x[:2] for x in alone]  # same tokens as without a neighbour
    twin, other = _record(served, "twin"), _record(served, "other")
    assert twin["tokens"] == _record(served, "alone")["tokens"]
    assert other["tokens"] != twin["tokens"]


def test_a_session_is_a_trajectory_the_learner_rescores_bit_for_bit_across_a_weight_update(served):
    client = served.client(default_headers={"X-RZ-Session": "train-me"})
    _conversation(client, turns=2)
    # a weight update (version 1) between turns, applied on the engine's own event loop
    new = {k: v + 0.01 for k, v in served.learner_model.state_dict().items()}

    async def publish():
        served.engine.load_weights(new, 1)

    served.http.call(publish())
    session = served.server.sessions.sessions["train-me"]
    messages = list(session.messages) + [{"role": "user", "content": "last"}]
    _turn(client, messages, seed=9)
    traj = session.trajectory(reward=1.0, group_id=0)
    versions = traj.sampled_versions()
    assert set(versions) == {0, 1} and versions == sorted(versions)
    mask = torch.tensor(traj.loss_mask[1:])
    behavior = torch.tensor(traj.behavior_logprobs[1:], dtype=torch.float32)
    v = torch.tensor(traj.versions[1:])
    old = learner_logprobs(served.learner_model, traj.tokens)
    model_v1 = copy.deepcopy(served.learner_model)
    model_v1.load_state_dict(new)
    newer = learner_logprobs(model_v1, traj.tokens)
    assert torch.equal(old[mask & (v == 0)], behavior[mask & (v == 0)])  # lag-0 at version 0
    assert torch.equal(newer[mask & (v == 1)], behavior[mask & (v == 1)])  # lag-0 at version 1
    assert not torch.equal(old[mask & (v == 1)], behavior[mask & (v == 1)])  # negative control
    served.http.call(_load(served.engine, served.learner_model.state_dict(), 2))


def test_a_compacting_agent_has_every_segment_trained_with_is_weight_exactly_1(served):
    """An agent that summarises its history twice: three segments, each sampled from its own prompt. Every
    sampled token is in the trajectory (before: only the last segment's), and the learner scores each segment
    bit for bit as the engine sampled it."""
    from rz_agents.trainer.sequence_logprobs import trajectory_logprobs

    client = served.client(default_headers={"X-RZ-Session": "compactor"})
    messages, sampled = [{"role": "user", "content": "task: count"}], 0
    for turn in range(6):
        if turn in (2, 4):  # compaction: the history is replaced by a summary of it
            messages = [{"role": "user", "content": f"summary of turns before {turn}: counting"}]
        _, ids, choice = _turn(client, messages, seed=40 + turn)
        sampled += len(ids)
        reply = choice.message.model_dump(exclude_none=True)
        messages = messages + [reply, {"role": "user", "content": "go"}]
    traj = served.server.sessions.sessions["compactor"].trajectory(reward=1.0, group_id=0)
    assert len(traj.segment_starts) == 2 and traj.info["segments"] == 3
    assert sum(traj.loss_mask) == sampled  # tokens trained == tokens sampled
    (logp,) = trajectory_logprobs(served.learner_model, [traj], {})
    mask = torch.tensor(traj.loss_mask[1:])
    behavior = torch.tensor(traj.behavior_logprobs[1:], dtype=torch.float32)
    assert torch.equal(logp[mask], behavior[mask])  # IS weight exactly 1 on every segment
    # negative control: the segments scored as one sequence (positions running on) do not match
    flat = learner_logprobs(served.learner_model, traj.tokens)
    later = mask.clone()
    later[: traj.segment_starts[0]] = False
    assert not torch.equal(flat[later], behavior[later])


async def _load(engine: RZEngine, state, version):
    engine.load_weights(state, version)


def test_past_max_sessions_the_least_recently_used_session_is_forgotten():
    from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer
    from rz_agents.serve import SessionStore

    store = SessionStore(ByteTokenizer(), ByteChatTemplate(), max_sessions=2)
    a, _ = store.get("a"), store.get("b")
    assert store.get("a") is a  # "a" is now the most recently used
    store.get("c")
    assert list(store.sessions) == ["a", "c"] and store.counters["sessions_evicted"] == 1
