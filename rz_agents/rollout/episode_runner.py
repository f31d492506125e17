"""The episode-runner seam: what drives one episode against the engine and returns its Trajectory.

The rollout controller schedules episodes (admission, groups, reruns, the lag bound) and hands each one to
the run's episode runner; it knows nothing of how the runner drives it. Two runners exist:

- ``AgentLoop`` (rollout/agent_loop.py): rz's own loop, stepping a Gymnasium env (``env.reset`` /
  ``env.step``) and sampling each turn from the engine; the default.
- ``OpenAIAPIAgent`` (rz_agents/agents/openai_api/): the user's agent written against the OpenAI API, run
  against a token-exact ``rz serve`` session of the run's engine; it needs no env.

A run chooses one with its ``agent:`` section (``agent.kind``: loop | openai; rz_agents/agents/spec.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any, Protocol, runtime_checkable

from rz_agents.rollout.agent_loop import EpisodeLimits, EpisodeSpec
from rz_agents.trajectory import Trajectory


@runtime_checkable
class EpisodeRunner(Protocol):
    """Drives one episode to its end. ``uses_env``: whether it steps an env (the controller then builds one
    from the run's env factory and passes it, else it passes None and builds none)."""

    uses_env: bool

    async def run_episode(
        self,
        engine: Any,
        env: Any,
        template: Any,
        tokenizer: Any,
        spec: EpisodeSpec,
        sampling: Any,
        limits: EpisodeLimits,
        executor: Executor | None = None,
        infra_exceptions: Sequence[str] = (),
    ) -> Trajectory:
        """The episode's Trajectory; EpisodeError when it cannot complete (InfraFailure when infrastructure
        lost it: the controller runs it again). ``sampling``: the engine's SamplingParams template."""
        ...
