"""Engine replicas as Ray actors, and the driver's router that the rollout controller uses as its engine.

Each replica is an ``RZEngine`` in its own process, served by a Ray async actor: ``generate`` calls from the
driver's episodes join the engine's continuous batch there. ``EngineReplicas`` (in the driver) has the
engine interface the agent loop calls (``generate``, ``load_weights``, ``version``) and routes each episode
to one replica for its whole life, so the replica's prefix cache holds the episode's previous turns; a new
episode goes to the replica serving the fewest live episodes. An episode is the asyncio task that runs it
(the controller runs every episode in its own task), so routing needs nothing from the agent loop.

Weights reach the replicas as one reference into Ray's object store (published by learner rank 0); each
replica fetches the object (once per node) and applies it between engine steps. With LoRA a replica's
policy holds the learner's adapters (``learner.lora``; their values come with the whole weights) and a
publication holds only the adapter tensors (with ``learner.freeze_vision`` all but the vision tower;
either one with the claim on the frozen rest that the replica checks: model/held_weights.py); the whole
weights go once (``load_base``: at the start, after a warm start or a resume) and again to a replica Ray
restarted, before its partial updates. A replica that dies is
restarted by Ray; its episodes in flight fail with ``ReplicaLost`` (the controller runs them again or drops
them, and counts both), and the router sends it the latest weights before routing to it again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ray
import torch
from ray.exceptions import RayActorError

from rz_agents.engine import EngineConfig, ImagePrompt, RZEngine
from rz_agents.engine.params import Completion, SamplingParams
from rz_agents.model.lora import LoraConfig
from rz_agents.model.weight_update import WeightUpdate
from rz_agents.rollout.agent_loop import EpisodeError, ReplicaLost
from rz_agents.runtime.config import ModelSpec
from rz_agents.runtime.factories import build_model, build_tokenizer
from rz_agents.runtime.ray.cluster import call_when_alive, node_id

log = logging.getLogger(__name__)


class EngineServer:
    """One engine replica (the body of a Ray async actor): builds the model from the run's spec."""

    def __init__(
        self,
        spec: ModelSpec,
        vocab: int,
        engine_cfg: EngineConfig,
        tokenizer: str,
        device: str = "cpu",
        lora: LoraConfig | None = None,
    ) -> None:
        """``lora``: the learner's adapters (``learner.lora``): the policy holds their shape; their values
        come with the learner's first weights (the driver loads the whole weights into every replica before
        the first episode: ``EngineReplicas.load_base``), as every later value does."""
        if engine_cfg.num_threads is not None:
            torch.set_num_threads(engine_cfg.num_threads)
        tok, _ = build_tokenizer(tokenizer, spec.checkpoint)
        model = build_model(dataclasses.replace(spec, device=device), vocab, lora=lora)
        model.requires_grad_(False)
        self.engine = RZEngine(model, engine_cfg, decode=tok.decode)

    async def generate(
        self, prompt: list[int], params: SamplingParams, images: ImagePrompt | None = None
    ) -> Completion:
        """RZEngine.generate: joins this replica's continuous batch (``images``: a vision-language
        prompt's)."""
        return await self.engine.generate(prompt, params, images=images)

    async def apply_update(self, update: WeightUpdate) -> int:
        """RZEngine.apply_update (between engine steps: this actor's event loop runs one step at a time);
        returns the update's version."""
        self.engine.apply_update(update)
        return update.version

    async def open_broadcast(self, address: str, rank: int, world: int, backend: str) -> None:
        """Join the weights group (actors.weight_transport: broadcast) as member ``rank``."""
        from rz_agents.runtime.ray.weight_broadcast import WeightBroadcast

        self.broadcast = await asyncio.to_thread(WeightBroadcast, address, rank, world, backend)

    async def receive_weights(self, version: int, published: list[str] | None = None) -> int:
        """Receive the weights learner rank 0 broadcasts (in a thread: generation goes on meanwhile), then
        apply them between engine steps. ``published``: the learner's ``published_names`` (None: every
        weight; else its trained part and the claim on the rest, which ``load_weights`` checks)."""
        from rz_agents.runtime.ray.weight_broadcast import published_layout

        like = published_layout(self.engine.model.state_dict(), published)
        state = await asyncio.to_thread(self.broadcast.receive, like)
        self.engine.apply_update(WeightUpdate.from_state(state, version))  # (the wire's flat form)
        return version

    async def close_broadcast(self) -> None:
        """Leave the weights group."""
        broadcast = getattr(self, "broadcast", None)
        if broadcast is not None:
            broadcast.close()
            self.broadcast = None

    async def stats(self) -> dict[str, Any]:
        """RZEngine.stats (numbers only)."""
        return {k: v for k, v in self.engine.stats().items() if isinstance(v, (int, float))}

    async def node(self) -> str:
        """The Ray node this replica runs on."""
        return node_id()


def _as_update(weights: Any, version: int) -> Any:
    """An object ref (to a ``WeightUpdate``) as it is; a flat state dict as a ``WeightUpdate`` of ``version``
    (the one record type a replica applies)."""
    if isinstance(weights, Mapping):
        return WeightUpdate.from_state(weights, version)
    return weights


@dataclass(eq=False)
class _Replica:
    index: int
    actor: Any
    healthy: bool = True
    reviving: bool = False
    episodes: int = 0  # live episodes routed here


class EngineReplicas:
    """The driver's view of the engine replicas; the rollout controller uses it as its engine."""

    def __init__(self, actors: list[Any]) -> None:
        self.replicas = [_Replica(i, a) for i, a in enumerate(actors)]
        self._version = 0
        self._weights: tuple[Any, int] | None = None  # what every replica must hold: (object ref, version)
        self._base: Any = None  # partial publications: the whole weights a restarted replica loads first
        self._routes: weakref.WeakKeyDictionary[asyncio.Task, _Replica] = weakref.WeakKeyDictionary()
        self._changed: asyncio.Event | None = None
        self._revivals: set[asyncio.Task] = set()
        self.counters = {"generated_tokens": 0, "requests": 0, "replicas_lost": 0, "replicas_revived": 0}

    @property
    def version(self) -> int:
        """The policy version every healthy replica samples with."""
        return self._version

    # ---- generation ----------------------------------------------------------------------------------
    async def generate(
        self, prompt: list[int], params: SamplingParams, images: ImagePrompt | None = None
    ) -> Completion:
        """Generate on the replica serving the calling episode (raises ReplicaLost if it dies meanwhile);
        ``images``: the pixels and grids of a vision-language prompt's image runs (RZEngine.generate)."""
        replica = await self._route(asyncio.current_task())
        self.counters["requests"] += 1
        try:
            completion = await replica.actor.generate.remote(list(prompt), params, images)
        except RayActorError as e:
            self._lost(replica)
            raise ReplicaLost(f"engine replica {replica.index} died: {type(e).__name__}") from e
        self.counters["generated_tokens"] += len(completion.tokens)
        return completion

    async def _route(self, task: asyncio.Task | None) -> _Replica:
        replica = self._routes.get(task) if task is not None else None
        if replica is not None and replica.healthy:
            return replica
        while True:
            healthy = [r for r in self.replicas if r.healthy]
            if healthy:
                break
            if not any(r.reviving for r in self.replicas):
                raise EpisodeError("no engine replica is left (each died more often than Ray restarts it)")
            await self._wait_for_change()
        replica = min(healthy, key=lambda r: (r.episodes, r.index))
        if task is not None:
            self._unbind(task)
            self._routes[task] = replica
            replica.episodes += 1
            task.add_done_callback(self._unbind)
        return replica

    def _unbind(self, task: asyncio.Task) -> None:
        replica = self._routes.pop(task, None)
        if replica is not None:
            replica.episodes -= 1

    async def _wait_for_change(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        self._changed.clear()
        await self._changed.wait()

    def _signal(self) -> None:
        if self._changed is not None:
            self._changed.set()

    # ---- failures ------------------------------------------------------------------------------------
    def _lost(self, replica: _Replica) -> None:
        """Stop routing to ``replica``; once Ray has restarted it, give it the latest weights and route
        again."""
        if not replica.healthy:
            return
        replica.healthy = False
        self.counters["replicas_lost"] += 1
        log.warning("engine replica %d died; its episodes in flight are lost", replica.index)
        for task, r in list(self._routes.items()):
            if r is replica:
                self._unbind(task)
        replica.reviving = True
        revival = asyncio.ensure_future(self._revive(replica))
        self._revivals.add(revival)
        revival.add_done_callback(self._revivals.discard)

    async def _revive(self, replica: _Replica) -> None:
        try:
            await call_when_alive(replica.actor.stats)
            while True:
                while self._weights is None:  # the newest weights are not in the store (broadcast mode)
                    await self._wait_for_change()
                target = self._weights
                if self._base is not None:  # (its rebuilt model holds the checkpoint's base, not the run's)
                    await call_when_alive(replica.actor.apply_update, self._base)
                await call_when_alive(replica.actor.apply_update, target[0])
                if self._weights is target:  # no newer publication meanwhile
                    break
            replica.healthy = True
            self.counters["replicas_revived"] += 1
            log.warning("engine replica %d is back", replica.index)
        except RayActorError:
            log.warning("engine replica %d is gone for good (restarts exhausted)", replica.index)
        finally:
            replica.reviving = False
            self._signal()

    # ---- weights -------------------------------------------------------------------------------------
    async def publish(self, weights: Any, version: int) -> None:
        """Every healthy replica applies ``weights`` (an object ref to a ``WeightUpdate`` of ``version``, or a
        flat state dict) as ``version``; returns once they all did. A replica that died meanwhile gets them
        when it is back."""
        weights = _as_update(weights, version)
        self._weights = (weights, version)
        self._signal()  # a replica being revived waits for weights in the store
        healthy = [r for r in self.replicas if r.healthy]
        results = await asyncio.gather(
            *(r.actor.apply_update.remote(weights) for r in healthy), return_exceptions=True
        )
        for replica, result in zip(healthy, results, strict=True):
            if isinstance(result, RayActorError):
                self._lost(replica)
            elif isinstance(result, BaseException):
                raise result
        self._version = version

    def received_broadcast(self, version: int) -> None:
        """Every replica applied ``version``, broadcast by learner rank 0 (not in the object store)."""
        self._weights = None
        self._version = version

    def load_base(self, weights: Any, version: int) -> None:
        """(Partial publications) Every replica takes the whole ``weights`` (an object ref: the frozen part
        and the trained one) as ``version`` now, and a replica Ray restarts takes them again before the
        partial updates published after them."""
        self._base = _as_update(weights, version)
        self.load_weights(self._base, version)

    def load_weights(self, weights: Any, version: int) -> None:
        """``publish`` from outside the event loop (blocks until every replica applied the weights)."""
        weights = _as_update(weights, version)
        self._weights = (weights, version)
        ray.get([r.actor.apply_update.remote(weights) for r in self.replicas])
        self._version = version

    # ---- figures -------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters summed over the live replicas, plus the router's own."""
        total: dict[str, Any] = {}
        for replica in self.replicas:
            try:
                stats = ray.get(replica.actor.stats.remote(), timeout=30)
            except (RayActorError, ray.exceptions.GetTimeoutError):
                continue
            for k, v in stats.items():
                if k != "version":
                    total[k] = total.get(k, 0) + v
        total.update(
            version=self._version,
            replicas=len(self.replicas),
            **{f"router_{k}": v for k, v in self.counters.items()},
        )
        return total
