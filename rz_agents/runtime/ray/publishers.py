"""The two Ray weight transports, one publisher each: Ray's object store and the broadcast group.

Both publish the learner's ``WeightUpdate`` (model/weight_update.py) to the engine replicas
(runtime/ray/engines.py: ``EngineReplicas``), which apply that one record type. The object store holds the
record itself (one ``ray.put`` by learner rank 0; a replica fetches it once per node); the broadcast sends
its tensors bucket by bucket from learner rank 0 (runtime/ray/weight_broadcast.py) and gives up for good,
handing over to the object store, once a replica is lost (the group's membership is fixed).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray

log = logging.getLogger(__name__)


class ObjectStorePublisher:
    """Publishes object-store references to the learner's ``WeightUpdate`` records to every replica."""

    def __init__(self, learner: Any, engine: Any) -> None:
        """``learner``: the ``LearnerGroup`` (it puts each record in the store); ``engine``: the replicas."""
        self.learner, self.engine = learner, engine
        self.count = 0
        self.last_bytes = 0

    def current(self) -> Any:
        """The reference to the learner's current record, if it is in the store already (else None)."""
        return self.learner.cached_ref()

    def load(self, update: Any, version: int) -> None:
        """Every replica applies ``update`` (a reference, or a flat state dict) as ``version`` now."""
        self.engine.load_weights(update, version)

    def load_whole(self) -> None:
        """Every replica takes the learner's whole weights now, and a restarted one again before the partial
        updates after them (only when updates leave a frozen part out)."""
        if self.learner.partial:
            self.engine.load_base(self.learner.full_weights_ref(), self.learner.version)

    async def publish(self, update: Any, version: int) -> None:
        """Every healthy replica applies ``update`` (None: the learner's current record, put in the store
        now) as ``version``."""
        if update is None:
            update = await self.learner.weights_ref_async()
        await self.engine.publish(update, version)
        self.count += 1
        self.last_bytes = self.learner.published_bytes


class BroadcastPublisher:
    """Broadcasts the learner's current ``WeightUpdate`` from learner rank 0 to every replica
    (``actors.weight_transport: broadcast``: NCCL on GPUs, gloo on CPU)."""

    def __init__(self, learner: Any, engine: Any, backend: str) -> None:
        """Learner rank 0 and every engine replica form the weights group (weight_broadcast.py)."""
        self.learner, self.engine = learner, engine
        self.count = 0
        self.last_bytes = 0
        rank0, replicas = learner.actors[0], [r.actor for r in engine.replicas]
        address = ray.get(rank0.rendezvous.remote())
        world = 1 + len(replicas)
        ray.get(
            [rank0.open_broadcast.remote(address, world, backend)]
            + [e.open_broadcast.remote(address, i + 1, world, backend) for i, e in enumerate(replicas)]
        )
        self.open = True

    async def publish(self, version: int) -> bool:
        """Broadcast the learner's current record as ``version``; False if it cannot be (a replica was lost:
        the group is closed for good, and the learner puts its records in the object store again)."""
        if self.open and self.engine.counters["replicas_lost"] == 0:
            try:
                sent = await asyncio.gather(
                    *(a.broadcast_weights.remote() for a in self.learner.actors),
                    *(
                        r.actor.receive_weights.remote(version, self.learner.published_names)
                        for r in self.engine.replicas
                    ),
                )
                self.last_bytes = sent[0]
                self.engine.received_broadcast(version)
                self.count += 1
                return True
            except ray.exceptions.RayError as e:
                log.warning("weight broadcast failed (%s); publishing through the object store", e)
        if self.open:
            self.close()
            self.learner.store_weights = True
        return False

    def close(self) -> None:
        """Leave the group (every member; a dead one is skipped)."""
        self.open = False
        for actor in [self.learner.actors[0]] + [r.actor for r in self.engine.replicas]:
            actor.close_broadcast.remote()
