"""An OpenEnv environment server as an rz_agents env: ``env.id: openenv:http://HOST:PORT``.

An OpenEnv server (``openenv-core``: ``create_app(Env, Action, Observation)`` served by uvicorn, usually in
a container) speaks HTTP ``/reset``, ``/step``, ``/state``, ``/schema``, ``/health`` and a WebSocket
``/ws``. Its HTTP ``/reset`` and ``/step`` are stateless (each request builds a fresh env and closes it:
openenv-core 0.3.0, ``HTTPEnvServer.register_routes``), so a multi-turn episode cannot run over them; the
adapter runs each episode in one WebSocket session with openenv's own client (``GenericEnvClient``), opened
at ``reset`` and closed when the episode ends.

Mapping: the reset/step observation (its fields, less ``done`` / ``reward`` / ``metadata``) becomes one
user message: the ``observation_field`` given, else its only string field, else the fields as JSON. The
policy's turn becomes the action: the ``action_field`` given, else the action schema's only string field
(``/schema``), else the turn is parsed as the action's JSON object. The step's ``reward`` (None counts 0)
and ``done`` are the reward and ``terminated``. At config load the server must answer ``/health`` and
``/schema``; see docs/env_adapters.md for what does not map.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import numpy as np

from rz_agents.envs.base import Message, MultiTurnTextEnv

PINNED_VERSION = "0.3.0"  # what scripts/install.sh installs and the tests run against
_IGNORED = ("metadata",)  # base Action/Observation fields that carry no text


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def check_installed(env_id: str) -> None:
    """ValueError in one line when openenv-core (or the websockets client it needs) is missing."""
    try:
        import openenv.core  # noqa: F401
        import websockets  # noqa: F401
    except ImportError as exc:
        raise ValueError(
            f"env.id {env_id!r}: openenv-core is not installed ({_one_line(exc)}); pip install --no-deps "
            f"openenv-core=={PINNED_VERSION} websockets, or bash scripts/install.sh"
        ) from None


def http_url(env_id: str, url: str) -> str:
    """The server's base HTTP URL (``ws://`` becomes ``http://``); ValueError naming a malformed one."""
    parts = urllib.parse.urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"env.id {env_id!r}: expected openenv:http://HOST:PORT (or https, ws, wss), got {url!r}"
        )
    return urllib.parse.urlunsplit((scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def get_json(env_id: str, base: str, path: str, timeout_s: float = 5.0) -> Any:
    """``GET base+path`` as JSON; ValueError in one line when the server does not answer."""
    try:
        with urllib.request.urlopen(base + path, timeout=timeout_s) as response:  # noqa: S310 - user's URL
            return json.loads(response.read().decode())
    except urllib.error.HTTPError as exc:
        raise ValueError(
            f"env.id {env_id!r}: GET {base}{path} answered HTTP {exc.code}: is it an OpenEnv server?"
        ) from None
    except json.JSONDecodeError:
        raise ValueError(
            f"env.id {env_id!r}: GET {base}{path} is not JSON: is it an OpenEnv server?"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ValueError(
            f"env.id {env_id!r}: no OpenEnv server answers at {base} (GET {path}: {_one_line(reason)}); "
            "start it first (e.g. uvicorn server.app:app --host 127.0.0.1 --port 8000)"
        ) from None


def _string_fields(schema: dict[str, Any]) -> list[str]:
    props = schema.get("properties") or {}
    return [k for k, v in props.items() if k not in _IGNORED and v.get("type") == "string"]


def resolve(env_id: str, url: str) -> Any:
    """The EnvTarget of ``openenv:URL``: the package is there and the server answers /health and /schema."""
    from rz_agents.envs.resolve import EnvTarget

    check_installed(env_id)
    base = http_url(env_id, url)
    get_json(env_id, base, "/health")
    schema = get_json(env_id, base, "/schema")
    if not isinstance(schema, dict) or not isinstance(schema.get("action"), dict):
        raise ValueError(
            f"env.id {env_id!r}: GET {base}/schema gave no action schema: is it an OpenEnv server?"
        )

    def make(
        action_field: str | None = None,
        observation_field: str | None = None,
        max_turns: int = 4,
        message_timeout_s: float = 60.0,
    ) -> OpenEnvEnv:
        return OpenEnvEnv(
            base,
            schema=schema,
            action_field=action_field,
            observation_field=observation_field,
            max_turns=max_turns,
            message_timeout_s=message_timeout_s,
        )

    make.__qualname__ = make.__name__ = "OpenEnvEnv"
    return EnvTarget(env_id, cls=make)


class OpenEnvEnv(MultiTurnTextEnv):
    """One OpenEnv server at ``url``, an episode per WebSocket session.

    ``schema`` is the server's ``/schema`` (fetched when None). A task given to ``reset`` is sent as the
    reset's keyword arguments (the server passes on those its env's ``reset`` takes), with the episode's
    ``seed`` unless the task gives one.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: dict[str, Any] | None = None,
        action_field: str | None = None,
        observation_field: str | None = None,
        max_turns: int = 4,
        message_timeout_s: float = 60.0,
    ) -> None:
        super().__init__(max_turns=max_turns)
        env_id = f"openenv:{url}"
        check_installed(env_id)
        self.url = http_url(env_id, url)
        self.schema = schema if schema is not None else get_json(env_id, self.url, "/schema")
        action = self.schema["action"]
        fields = [k for k in (action.get("properties") or {}) if k not in _IGNORED]
        if action_field is not None and action_field not in fields:
            raise ValueError(
                f"env.kwargs.action_field: the server's action has no field {action_field!r}; it has "
                f"{', '.join(fields) or 'none'}"
            )
        strings = _string_fields(action)
        self.action_field = action_field or (strings[0] if len(strings) == 1 else None)
        self.action_fields = fields
        self.observation_field = observation_field
        self.message_timeout_s = message_timeout_s
        self._client: Any = None

    # --- the session ------------------------------------------------------------------------------
    def _connect(self) -> Any:
        from openenv.core import GenericEnvClient

        self._disconnect()
        client = GenericEnvClient(base_url=self.url, message_timeout_s=self.message_timeout_s).sync()
        client.connect()
        self._client = client
        return client

    def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    # --- mapping ----------------------------------------------------------------------------------
    def text_of(self, observation: dict[str, Any]) -> str:
        """The observation as the text of one message (see the module docstring)."""
        if self.observation_field is not None:
            if self.observation_field not in observation:
                raise ValueError(
                    f"env.kwargs.observation_field: the server's observation has no field "
                    f"{self.observation_field!r}; it has {', '.join(observation) or 'none'}"
                )
            return str(observation[self.observation_field])
        strings = [k for k, v in observation.items() if isinstance(v, str)]
        if len(strings) == 1:
            return observation[strings[0]]
        return json.dumps(observation, sort_keys=True, default=str)

    def action_of(self, text: str) -> dict[str, Any] | str:
        """The action payload for the policy's turn, or the message to give back when it is not one."""
        if self.action_field is not None:
            return {self.action_field: text}
        try:
            action = json.loads(text.strip())
        except json.JSONDecodeError as exc:
            return (
                f"Write the action as one JSON object with the fields {', '.join(self.action_fields)} "
                f"({exc.msg})."
            )
        if not isinstance(action, dict):
            return f"Write the action as one JSON object with the fields {', '.join(self.action_fields)}."
        return action

    # --- the episode ------------------------------------------------------------------------------
    def _reset(self, task: dict[str, Any] | None, rng: np.random.Generator) -> tuple[list[Message], dict]:
        kwargs = dict(task or {})
        kwargs.setdefault("seed", int(rng.integers(2**31)))
        kwargs.pop("id", None)
        result = self._connect().reset(**kwargs)
        if result.done:
            self._disconnect()
            raise RuntimeError(f"the OpenEnv server at {self.url} ended the episode at reset")
        return [{"role": "user", "content": self.text_of(result.observation)}], {"tools": []}

    def _step(self, text: str) -> tuple[str, float, bool, dict]:
        if self._client is None:
            raise RuntimeError("no OpenEnv session: reset() first")
        action = self.action_of(text)
        if isinstance(action, str):
            return action, 0.0, False, {"invalid_action": True}
        try:
            result = self._client.step(action)
        except RuntimeError as exc:
            if "VALIDATION_ERROR" not in str(exc):
                raise
            # the policy's action does not fit the server's Action model: tell it, the episode goes on
            return f"Invalid action: {exc}", 0.0, False, {"invalid_action": True}
        done = bool(result.done)
        if done or self.turn + 1 >= self.max_turns:
            self._disconnect()
        reward = 0.0 if result.reward is None else float(result.reward)
        return self.text_of(result.observation), reward, done, {}

    def close(self) -> None:
        """Close the episode's WebSocket session, if one is open."""
        self._disconnect()
        super().close()
