"""Token-exact sessions: a conversation kept as the tokens the model saw and sampled, never re-tokenized.

A chat request that names a session (header ``X-RZ-Session``, ``metadata.rz_session`` or the URL prefix
``/sessions/ID/v1``) is answered from the session's token history: when its messages extend the messages
the session has seen (the previous request's, plus the assistant message the server returned), only the
new messages are rendered (``encode_continuation``) and appended; the sampled tokens stay exactly as
sampled, with their log-probs and policy versions. That is the rollout data the agent loop records, so a
session becomes the same ``Trajectory`` (``Session.trajectory``).

A request whose messages do not extend the history (the client compacted, summarised, truncated or
rewrote its history, or changed the tools) starts a new segment rendered from the request's messages:
counted (``SessionStore.counters["prefix_mismatches"]``, ``segments``) and logged. Every segment is kept:
the trajectory holds them all, one after the other, with ``Trajectory.segment_starts`` marking where each
begins, and the learner scores each segment as the sequence the model saw (from position 0), so every
sampled token of the episode is trained with the episode's advantage (the reward is the episode's, broadcast
to its segments). A segment that sampled nothing is not kept.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rz_agents.images import as_pil
from rz_agents.rollout.agent_loop import message_pngs
from rz_agents.serve.openai_schema import OpenAIError
from rz_agents.trajectory import NOT_SAMPLED, Trajectory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionPolicy:
    """What a training session imposes on every request, whatever the client asks: the run's sampling
    distribution (the learner scores tokens under it), a seed per turn and the episode's token budget."""

    temperature: float
    top_k: int
    top_p: float
    seed: int
    max_tokens_per_turn: int
    max_session_tokens: int
    max_turns: int | None = None


def _canonical_arguments(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return json.dumps(arguments, sort_keys=True)


def _content_key(content: Any) -> Any:
    """A message content's key: its text, or for a list of parts each part's text or image pixels' digest."""
    if not isinstance(content, list):
        return content or ""
    return tuple(
        ("text", part["text"]) if part["type"] == "text" else ("image", image_digest(part["image"]))
        for part in content
    )


def image_digest(image: Any) -> str:
    """A digest of an image's size and RGB pixels (two parts with the same digest render the same)."""
    pil = as_pil(image)
    return hashlib.sha256(repr(pil.size).encode() + pil.tobytes()).hexdigest()


def message_key(message: dict[str, Any]) -> tuple:
    """What the chat template renders of a message (ids and key order do not count): two messages with the
    same key render to the same tokens."""
    calls = tuple(
        (c["function"]["name"], _canonical_arguments(c["function"].get("arguments")))
        for c in message.get("tool_calls") or ()
    )
    content = _content_key(message.get("content"))
    return (message["role"], content, message.get("reasoning_content"), calls)


@dataclass
class Session:
    """One conversation's tokens with their loss mask, behavior log-probs and versions (the current segment),
    and the messages those tokens render."""

    id: str
    policy: SessionPolicy | None = None
    tokens: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    behavior: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools_key: str | None = None
    last_turn_closed: bool = True  # the last sampled turn ended with a stop token
    turns: int = 0
    prefix_mismatches: int = 0
    segments: int = 0
    sampled_tokens_dropped: int = 0  # kept for old clients of the record: segments are never dropped now
    segment_start: int = 0  # where the current segment begins in ``tokens`` (earlier segments come before)
    segment_starts: list[int] = field(default_factory=list)
    limit_reached: str | None = None  # why a training session refused a request (its budget or turn limit)
    records: bool = False  # its owner opted in to reading its token record (POST /v1/sessions)
    # the images of ``tokens``' image runs (PNG bytes, in order; a vision-language policy's), and where the
    # current segment's begin
    images: list[bytes] = field(default_factory=list)
    segment_image_start: int = 0
    # A session the server opened (``SessionStore.open``: a training episode's) is reached only through this
    # unguessable token (``capability``), never by its id: one episode's agent cannot name another's.
    capability: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    def add_context(self, ids: Sequence[int]) -> None:
        """Tokens the policy did not sample (prompt, observations, template glue)."""
        self.tokens.extend(int(t) for t in ids)
        self.mask.extend([False] * len(ids))
        self.behavior.extend([0.0] * len(ids))
        self.versions.extend([NOT_SAMPLED] * len(ids))

    def add_sampled(self, tokens: Sequence[int], logprobs: Sequence[float], versions: Sequence[int]) -> None:
        """A sampled turn, exactly as the engine returned it."""
        self.tokens.extend(int(t) for t in tokens)
        self.mask.extend([True] * len(tokens))
        self.behavior.extend(float(x) for x in logprobs)
        self.versions.extend(int(v) for v in versions)
        self.turns += 1

    def snapshot(self) -> tuple:
        """What ``restore`` puts back (a request that failed or was cancelled leaves no trace)."""
        return (
            list(self.tokens), list(self.mask), list(self.behavior), list(self.versions), list(self.messages),
            self.tools_key, self.last_turn_closed, self.turns, self.segments, self.segment_start,
            list(self.segment_starts), list(self.images), self.segment_image_start,
        )  # fmt: skip

    def restore(self, state: tuple) -> None:
        (self.tokens, self.mask, self.behavior, self.versions, self.messages, self.tools_key,
         self.last_turn_closed, self.turns, self.segments, self.segment_start,
         self.segment_starts, self.images, self.segment_image_start) = state  # fmt: skip

    def new_segment(self) -> None:
        """Start a new token segment; the current one is kept when it sampled anything (else dropped)."""
        if any(self.mask[self.segment_start :]):
            self.segment_start = len(self.tokens)
            self.segment_image_start = len(self.images)
            if self.segment_start:
                self.segment_starts.append(self.segment_start)
        else:
            for seq in (self.tokens, self.mask, self.behavior, self.versions):
                del seq[self.segment_start :]
            del self.images[self.segment_image_start :]

    @property
    def current(self) -> list[int]:
        """The current segment's tokens: what the engine continues."""
        return self.tokens[self.segment_start :]

    @property
    def current_images(self) -> list[bytes]:
        """The images of the current segment's image runs, in order: what the engine's request carries."""
        return self.images[self.segment_image_start :]

    @property
    def num_sampled(self) -> int:
        return sum(self.mask)

    def trajectory(
        self, reward: float, group_id: int | str, info: dict[str, Any] | None = None
    ) -> Trajectory:
        """The session's segments as one validated Trajectory (TrajectoryError if it sampled nothing)."""
        traj = Trajectory(
            tokens=list(self.tokens),
            loss_mask=list(self.mask),
            behavior_logprobs=list(self.behavior),
            versions=list(self.versions),
            reward=float(reward),
            group_id=group_id,
            info={
                "session": self.id,
                "turns": self.turns,
                "prefix_mismatches": self.prefix_mismatches,
                "segments": len(self.segment_starts) + 1,
                "sampled_tokens_dropped": self.sampled_tokens_dropped,
                **(info or {}),
            },
            segment_starts=list(self.segment_starts),
            images=list(self.images),
        )
        traj.validate()
        return traj


class SessionStore:
    """Sessions by id, and how their prompts are built (append-only, or a new segment on a mismatch)."""

    def __init__(self, tokenizer, template, max_sessions: int = 10_000) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.stops = tuple(template.stop_token_ids(tokenizer))
        # Clients rarely delete their sessions: past max_sessions the least recently used idle one is
        # forgotten (counted), so a long-running server's memory stays bounded.
        self.max_sessions = max_sessions
        self.sessions: dict[str, Session] = {}
        self.capabilities: dict[str, str] = {}  # capability token -> id of a session the server opened
        self.counters = {
            "sessions_opened": 0,
            "session_requests": 0,
            "appended_requests": 0,
            "prefix_mismatches": 0,
            "tokens_appended": 0,
            "tokens_rendered": 0,
            "sessions_evicted": 0,
        }

    def open(self, session_id: str, policy: SessionPolicy | None = None) -> Session:
        """A new empty session (replacing one of the same id), reachable over HTTP only through its
        ``capability`` (``capability_of``); the id is the server's own name for it."""
        self.close(session_id)
        session = self._new(session_id, policy)
        session.capability = secrets.token_urlsafe(24)
        self.capabilities[session.capability] = session_id
        return session

    def _new(self, session_id: str, policy: SessionPolicy | None = None) -> Session:
        session = Session(session_id, policy=policy)
        self.sessions[session_id] = session
        self.counters["sessions_opened"] += 1
        self._evict()
        return session

    def capability_of(self, session_id: str) -> str | None:
        """The token that reaches a session the server opened (None for a client's own session)."""
        session = self.sessions.get(session_id)
        return session.capability if session is not None else None

    def resolve(self, name: str, owner: str = "") -> str:
        """The id of the session a client means by ``name``: a capability's session, else ``name`` in the
        client's namespace (``owner``, from its API key). A name that is the id of a session the server
        opened is refused: that session answers to its capability only."""
        opened = self.capabilities.get(name)
        if opened is not None:
            return opened
        session_id = f"{owner}/{name}" if owner else name
        session = self.sessions.get(session_id)
        if session is not None and session.capability is not None:
            raise OpenAIError(
                f"session {name!r} is not yours", "session", status=403, code="session_not_owned"
            )
        return session_id

    def get(self, session_id: str) -> Session:
        """The session of that id (now the most recently used), opened on first use."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            return self._new(session_id)
        self.sessions[session_id] = session
        return session

    def _evict(self) -> None:
        """Forget the least recently used idle sessions beyond max_sessions (a training session, which its
        env closes, a session the server opened and one with a request in flight are never forgotten)."""
        excess = len(self.sessions) - self.max_sessions
        if excess <= 0:
            return
        idle = [
            sid
            for sid, s in self.sessions.items()
            if not s.lock.locked() and s.policy is None and s.capability is None
        ]
        for sid in idle[:excess]:
            del self.sessions[sid]
            self.counters["sessions_evicted"] += 1

    def close(self, session_id: str) -> Session | None:
        """Forget the session (and its capability); returns it (None if unknown)."""
        session = self.sessions.pop(session_id, None)
        if session is not None and session.capability is not None:
            self.capabilities.pop(session.capability, None)
        return session

    def prompt(
        self, session: Session, messages: list[dict[str, Any]], tools: list | None, enable_thinking: bool
    ) -> list[int]:
        """The session's tokens for this request's messages, ready to sample the next assistant turn."""
        self.counters["session_requests"] += 1
        tools_key = json.dumps(tools, sort_keys=True) if tools else None
        seen = session.messages
        if session.tokens and self._extends(seen, messages) and tools_key == session.tools_key:
            new = messages[len(seen) :]
            ids = [] if session.last_turn_closed else [self.stops[0]]
            ids += self.template.encode_continuation(self.tokenizer, new, enable_thinking=enable_thinking)
            session.add_context(ids)
            session.images += message_pngs(new)
            self.counters["appended_requests"] += 1
            self.counters["tokens_appended"] += len(ids)
        else:
            if session.tokens:
                self._mismatch(session, seen, messages, tools_key != session.tools_key)
            ids = self.template.encode_prompt(
                self.tokenizer, messages, tools=tools, enable_thinking=enable_thinking
            )
            session.new_segment()
            session.add_context(ids)
            session.images += message_pngs(messages)
            session.segments += 1
            session.tools_key = tools_key
            self.counters["tokens_rendered"] += len(ids)
        session.messages = list(messages)
        return session.current

    def record(self, session: Session, completion, assistant_message: dict[str, Any]) -> None:
        """The sampled turn and the assistant message returned for it (the next request must repeat it)."""
        session.add_sampled(completion.tokens, completion.logprobs.tolist(), completion.versions)
        session.last_turn_closed = bool(completion.tokens) and completion.tokens[-1] in self.stops
        session.messages.append(assistant_message)

    @staticmethod
    def _extends(seen: list[dict[str, Any]], messages: list[dict[str, Any]]) -> bool:
        if len(messages) <= len(seen):
            return False
        return all(message_key(a) == message_key(b) for a, b in zip(seen, messages, strict=False))

    def _mismatch(self, session: Session, seen: list, messages: list, tools_changed: bool) -> None:
        session.prefix_mismatches += 1
        self.counters["prefix_mismatches"] += 1
        where = next(
            (
                i
                for i, (a, b) in enumerate(zip(seen, messages, strict=False))
                if message_key(a) != message_key(b)
            ),
            min(len(seen), len(messages)),
        )
        why = "the tools changed" if tools_changed else f"message {where} differs from the history"
        log.info(
            "session %r: the request does not extend the session's history (%s); a new token segment starts "
            "(the %d sampled tokens before it are kept and trained as their own segments)",
            session.id, why, session.num_sampled,
        )  # fmt: skip
