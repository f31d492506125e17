"""A small OpenEnv environment server, written the way openenv-core's own template (``openenv init``) writes
one: Action and Observation models, an ``Environment`` subclass, ``create_app`` served by uvicorn.

Start it as OpenEnv's docs do: ``python -m uvicorn tests.envs.openenv_echo_server:app --host 127.0.0.1
--port PORT``. Each episode asks the policy to echo a word drawn from the reset seed; a reply containing
the word ends the episode with reward 1, another reply gets the word again with reward 0 (a multi-turn
episode). ``reset(word=...)`` picks the word (a task); ``reset(miss_reward=...)`` rewards each miss with it
instead of 0 (so that a test can see the server's reward in a batch an untrained policy earned).
"""

from __future__ import annotations

import random
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger")


class EchoAction(Action):
    """The policy's reply."""

    message: str = Field(..., description="Message to send")


class EchoObservation(Observation):
    """What the policy reads."""

    prompt: str = Field(default="", description="Instruction for the next turn")
    attempts: int = Field(default=0, description="Replies so far")


class EchoWordEnvironment(Environment):
    """Echo the word back; one session per WebSocket client."""

    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self) -> None:
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.word = WORDS[0]
        self.miss_reward = 0.0

    def reset(
        self, seed: int | None = None, word: str | None = None, miss_reward: float = 0.0
    ) -> EchoObservation:
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.word = word or random.Random(seed).choice(WORDS)
        self.miss_reward = miss_reward
        return EchoObservation(prompt=f"Say the word {self.word}.", attempts=0, done=False, reward=0.0)

    def step(self, action: EchoAction) -> EchoObservation:  # type: ignore[override]
        self._state.step_count += 1
        hit = self.word in action.message.lower()
        prompt = "Correct." if hit else f"No. Say the word {self.word}."
        return EchoObservation(
            prompt=prompt, attempts=self._state.step_count, done=hit, reward=1.0 if hit else self.miss_reward
        )

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    EchoWordEnvironment, EchoAction, EchoObservation, env_name="echo_word", max_concurrent_envs=16
)
