"""Joining Ray: start a local instance or connect to a cluster, and the resource requests of each actor
kind."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError

from rz_agents.runtime.config import ActorsConfig, TrainConfig

log = logging.getLogger(__name__)


def logical_cpus(p: ActorsConfig) -> float:
    """The CPUs the actors of ``actors:`` reserve in all."""
    return (
        p.engines * p.cpus_per_engine
        + p.env_workers * p.cpus_per_env_worker
        + p.learner_ranks * p.cpus_per_learner_rank
    )


def connect(cfg: TrainConfig) -> bool:
    """Make sure this process is a Ray driver. Returns True when it started a local instance (which the run
    then shuts down at close); an already initialised Ray (a test session, a notebook) is used as it is."""
    if ray.is_initialized():
        return False
    if cfg.ray.address:
        ray.init(address=cfg.ray.address, logging_level=logging.WARNING)
        return False
    # Logical CPUs: at least what the actors reserve, so a small machine still schedules every actor
    # (the actors' torch threads, not these numbers, decide how many cores they use).
    num_cpus = cfg.ray.num_cpus or max(os.cpu_count() or 1, int(logical_cpus(cfg.actors) + 0.999))
    # Read by the raylet this call starts (and inherited by the workers it starts).
    if not cfg.ray.memory_monitor:
        os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    os.environ.setdefault("RAY_worker_niceness", str(cfg.ray.worker_niceness))
    # address="local": always a new instance of our own; without it ray.init joins any Ray cluster already
    # running on the machine and then refuses num_cpus ("must not be provided").
    ray.init(
        address="local",
        num_cpus=num_cpus,
        num_gpus=None,
        object_store_memory=cfg.ray.object_store_mb * 2**20,
        include_dashboard=False,
        logging_level=logging.WARNING,
    )
    return True


def actor_options(cpus: float, gpus: float, resources: dict[str, float], **extra: Any) -> dict[str, Any]:
    """``.options(...)`` of one actor: its CPUs, GPUs and custom (node-pinning) resources."""
    options: dict[str, Any] = {"num_cpus": cpus, **extra}
    if gpus:
        options["num_gpus"] = gpus
    if resources:
        options["resources"] = dict(resources)
    return options


def node_id() -> str:
    """The id of the Ray node this process runs on (tests check where actors landed)."""
    return ray.get_runtime_context().get_node_id()


async def call_when_alive(method: Any, *args: Any, timeout_s: float = 600.0) -> Any:
    """``await method.remote(*args)``, waiting out a restart of its actor (Ray answers calls to an actor
    that is restarting with ActorUnavailableError). An actor that is dead for good raises ActorDiedError."""
    delay = 0.1
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await method.remote(*args)
        except ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(2 * delay, 2.0)
