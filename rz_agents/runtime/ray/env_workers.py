"""Env workers as Ray actors: the envs (sandboxes, desktops) live there; episodes' reset/step run there.

An ``EnvHost`` is a threaded Ray actor holding envs by id; each env call runs on one of its threads (env
calls block on subprocesses and browsers, like the local runtime's thread pool). In the driver, the
controller's env factory hands out ``RemoteEnv`` handles, each bound to one worker (the one holding the
fewest envs) for its life; the agent loop awaits their ``reset``/``step`` like local env calls.

A worker that dies is restarted by Ray. The episodes it was serving fail with ``ReplicaLost`` (run again or
dropped by the controller, and counted). The handles bound to it stay usable: a worker creates an env the
first time an episode resets it, so the next episode on a handle rebuilds its env, on another worker while
this one is down, or on this one once Ray has restarted it.

A worker builds its envs in its own process: it imports the config's ``imports`` and plugins and resolves
``env.id`` itself. So that a user's package the driver imports from a folder on its ``sys.path`` (not
installed) is found there too, a worker puts the driver's import path entries it lacks in front of its own
(those that exist on its node); ``check_env_workers`` turns a worker that still cannot build the env into
one line at start-up.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
from typing import Any

import ray
from ray.exceptions import RayActorError

from rz_agents.rollout.agent_loop import ReplicaLost
from rz_agents.runtime.config import EnvSpec
from rz_agents.runtime.factories import env_factory
from rz_agents.runtime.ray.cluster import call_when_alive, node_id

log = logging.getLogger(__name__)


class EnvGone(LookupError):
    """The env was not on its worker (the worker restarted since the env was created)."""


def driver_sys_path() -> tuple[str, ...]:
    """This process's import path, for its env workers (``''``, the working directory, made absolute)."""
    return tuple(os.path.abspath(p) for p in sys.path)


def add_to_sys_path(paths: tuple[str, ...]) -> None:
    """Put the entries of ``paths`` that this process lacks and that exist here in front of ``sys.path``, in
    their order."""
    missing = [p for p in dict.fromkeys(paths) if p not in sys.path and os.path.exists(p)]
    sys.path[:0] = missing


class EnvHost:
    """One env worker (the body of a threaded Ray actor). ``sys_path``: the driver's (``driver_sys_path``)."""

    def __init__(
        self,
        spec: EnvSpec,
        imports: tuple[str, ...] = (),
        max_turns: int | None = None,
        sys_path: tuple[str, ...] = (),
    ) -> None:
        add_to_sys_path(sys_path)
        self._make = None
        self._problem: str | None = None
        try:
            self._make = env_factory(spec, imports, max_turns)
        except Exception as e:  # reported by problem(): one line in the driver, not a dead actor
            self._problem = " ".join(str(e).split()) or type(e).__name__
        self._envs: dict[int, Any] = {}
        self._lock = threading.Lock()

    def problem(self) -> str | None:
        """Why this worker cannot build the run's envs (a module of ``imports`` or ``env.id`` it cannot
        import, an id not registered here), or None."""
        return self._problem

    def _env(self, env_id: int, create: bool) -> Any:
        with self._lock:
            env = self._envs.get(env_id)
        if env is None:
            if not create:
                raise EnvGone(f"env {env_id} is not on this worker (it restarted)")
            if self._make is None:
                raise ValueError(self._problem)
            env = self._make()
            with self._lock:
                self._envs[env_id] = env
        return env

    def reset(self, env_id: int, seed: int | None, options: dict[str, Any] | None) -> Any:
        """``env.reset`` (the env is created on its first reset)."""
        return self._env(env_id, create=True).reset(seed=seed, options=options)

    def step(self, env_id: int, action: str) -> Any:
        """``env.step``."""
        return self._env(env_id, create=False).step(action)

    def close(self, env_id: int) -> None:
        """Close and forget one env."""
        with self._lock:
            env = self._envs.pop(env_id, None)
        if env is not None:
            env.close()

    def close_all(self) -> None:
        """Close every env (before the actor is killed)."""
        with self._lock:
            envs, self._envs = list(self._envs.values()), {}
        for env in envs:
            try:
                env.close()
            except Exception as e:  # closing is best effort
                log.warning("env.close failed: %r", e)

    def num_envs(self) -> int:
        """How many envs live here."""
        return len(self._envs)

    def node(self) -> str:
        """The Ray node this worker runs on."""
        return node_id()


def check_env_workers(workers: list[Any], timeout_s: float | None = None) -> None:
    """Wait for the env workers to start; ValueError (one line) naming the first that cannot build the env."""
    try:
        problems = ray.get([w.problem.remote() for w in workers], timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise ValueError(
            f"the env workers did not start within {timeout_s:.0f} s (watchdog_s): does the cluster have "
            "the CPUs and resources actors: asks for them (cpus_per_env_worker, env_worker_resources)?"
        ) from None
    nodes = None
    for i, problem in enumerate(problems):
        if problem:
            nodes = nodes or ray.get([w.node.remote() for w in workers])
            raise ValueError(
                f"env worker {i} (Ray node {nodes[i][:12]}) cannot build the run's envs: {problem}. Env "
                "workers import the env in their own processes: install its package on every node, or put "
                "its folder on a path that exists on every node (the driver's sys.path entries are added)"
            )


class RemoteEnv:
    """The driver's handle on one env living in a worker; ``reset``/``step`` are awaited by the agent loop."""

    def __init__(self, factory: RemoteEnvFactory, worker: int, env_id: int) -> None:
        self._factory = factory
        self.worker = worker
        self.env_id = env_id

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        """``env.reset`` on the worker. Nothing of the episode exists yet, so if the worker is down the env
        moves to another one (or waits for this one to be restarted, when no other is up)."""
        factory = self._factory
        while True:
            actor = factory.workers[self.worker]
            last_try = not factory.other_worker_up(self.worker)
            try:
                if last_try:
                    result = await call_when_alive(actor.reset, self.env_id, seed, options)
                else:
                    result = await actor.reset.remote(self.env_id, seed, options)
                factory.mark_up(self.worker)
                return result
            except RayActorError as e:
                factory.mark_down(self.worker)
                if last_try:
                    raise ReplicaLost(f"env worker {self.worker} died: {type(e).__name__}") from e
                factory.move(self)

    async def step(self, action: str) -> Any:
        """``env.step`` on the worker (if it died, the episode is lost: its env state was there)."""
        try:
            return await self._factory.workers[self.worker].step.remote(self.env_id, action)
        except RayActorError as e:
            self._factory.mark_down(self.worker)
            raise ReplicaLost(f"env worker {self.worker} died: {type(e).__name__}") from e
        except EnvGone as e:
            raise ReplicaLost(str(e)) from e

    def close(self) -> None:
        """Close the env on its worker (not awaited; a dead worker has nothing left to close)."""
        self._factory.release(self)
        self._factory.workers[self.worker].close.remote(self.env_id)


class RemoteEnvFactory:
    """The controller's env factory in the Ray runtime: a new ``RemoteEnv`` on the least-loaded worker.

    A worker found dead is avoided for ``retry_after_s`` (Ray is restarting it), then tried again.
    """

    def __init__(self, workers: list[Any], retry_after_s: float = 5.0) -> None:
        self.workers = workers
        self.retry_after_s = retry_after_s
        self.envs_per_worker = [0] * len(workers)
        self._down_since: dict[int, float] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()  # the controller calls the factory from its thread pool

    def _up(self, worker: int) -> bool:
        since = self._down_since.get(worker)
        return since is None or time.monotonic() - since > self.retry_after_s

    def _pick(self, exclude: int | None = None) -> int:
        candidates = [w for w in range(len(self.workers)) if w != exclude and self._up(w)]
        if not candidates:
            candidates = [w for w in range(len(self.workers)) if w != exclude] or [exclude]
        return min(candidates, key=lambda w: (self.envs_per_worker[w], w))

    def __call__(self) -> RemoteEnv:
        with self._lock:
            worker = self._pick()
            self.envs_per_worker[worker] += 1
            return RemoteEnv(self, worker, next(self._ids))

    def other_worker_up(self, worker: int) -> bool:
        """Is a worker other than ``worker`` believed up?"""
        return any(self._up(w) for w in range(len(self.workers)) if w != worker)

    def move(self, env: RemoteEnv) -> None:
        """Rebind ``env`` (not yet reset) to the least-loaded other worker that is up."""
        with self._lock:
            self.envs_per_worker[env.worker] -= 1
            env.worker = self._pick(exclude=env.worker)
            self.envs_per_worker[env.worker] += 1

    def mark_down(self, worker: int) -> None:
        """``worker`` failed a call."""
        self._down_since.setdefault(worker, time.monotonic())

    def mark_up(self, worker: int) -> None:
        """``worker`` answered a call."""
        self._down_since.pop(worker, None)

    def release(self, env: RemoteEnv) -> None:
        """``env`` was closed."""
        with self._lock:
            self.envs_per_worker[env.worker] -= 1
