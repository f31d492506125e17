"""The learner as Ray actors: ``learner_ranks`` processes in one torch.distributed group (gloo on CPU, NCCL
on GPU), the model sharded with FSDP2 when there are several (trainer/sharding.py). Only rank 0 answers the
driver: every rank receives the same batch (one object in the store), runs ``Learner.step`` on its share of
the micro-batches, and rank 0 returns the metrics; after a step every rank joins the all-gather of the
weights and rank 0 puts the whole state in Ray's object store (one ``ray.put``) and returns the reference;
the driver hands it to the engines, which fetch the object (the driver never does). With LoRA
(``learner.lora``) a publication holds only the adapter tensors (``Learner.published_names``; with several
ranks the adapters are whole on every rank and rank 0 sends its own), with ``learner.freeze_vision`` all but
the vision tower, and either one the SHA-256 of the frozen rest (``Learner.iter_published``: the engines
check it); the whole weights are put in the store only on demand (``full_weights_ref``: exports, the
engines' base). A
checkpoint has every rank write its own shards into one folder (``save_state``: the run directory must be one
filesystem for all ranks, as it is on one node).

Ranks are never restarted: a rank's death ends the run (``LearnerLost``) with its last checkpoint intact.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from pathlib import Path
from typing import Any

import ray
import torch
from ray.exceptions import RayActorError

from rz_agents.model.weight_update import WeightUpdate
from rz_agents.runtime.config import ModelSpec
from rz_agents.runtime.factories import build_model, checkpoint_skeleton, checkpoint_weights
from rz_agents.runtime.plan import RunPlan
from rz_agents.trainer.learner import Learner

log = logging.getLogger(__name__)


class LearnerLost(RuntimeError):
    """A learner rank died; the run stops (resume it from its last checkpoint)."""


class LearnerRank:
    """One learner rank (the body of a Ray actor)."""

    def __init__(
        self,
        rank: int,
        world: int,
        spec: ModelSpec,
        vocab: int,
        plan: RunPlan,
        device: str = "cpu",
    ) -> None:
        """``plan``: the run's (learner config, sampling, lag bound, torch threads: those of the engines)."""
        if plan.num_threads is not None:
            torch.set_num_threads(plan.num_threads)
        self.rank, self.world = rank, world
        self.spec, self.vocab, self.plan, self.device = spec, vocab, plan, device
        self.learner: Learner | None = None

    def rendezvous(self) -> str:
        """(rank 0) A tcp:// address on this node with a free port for the group's rendezvous."""
        host = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind(("", 0))
            return f"tcp://{host}:{s.getsockname()[1]}"

    def start(self, address: str | None) -> str:
        """Join the group (several ranks), build and shard the model, build the learner; returns the node
        id."""
        from rz_agents.runtime.ray.cluster import node_id

        ranks = None
        if self.world > 1:
            import torch.distributed as dist

            from rz_agents.trainer.sharding import ShardedRanks

            backend = "nccl" if self.device == "cuda" else "gloo"
            dist.init_process_group(backend, init_method=address, rank=self.rank, world_size=self.world)
            ranks = ShardedRanks(self.device)
        if ranks is not None and self.spec.checkpoint and not self.plan.learner.lora.enabled:
            # Each rank allocates only its shards and cuts them from the checkpoint one tensor at a time.
            # (With LoRA each rank builds the whole model, adapters included, then keeps its base shards.)
            skeleton = checkpoint_skeleton(self.spec, freeze_vision=self.plan.learner.freeze_vision)
            self.learner = self.plan.build_learner(skeleton, ranks=ranks)
            self.learner.replace_weights(checkpoint_weights(self.spec))
            return node_id()
        learner = self.plan.learner
        spec = dataclasses.replace(self.spec, device=self.device)
        # (each rank seeds the same adapters; the engines take theirs from rank 0's first weights)
        model = build_model(spec, self.vocab, lora=learner.lora, freeze_vision=learner.freeze_vision)
        self.learner = self.plan.build_learner(model, ranks=ranks)
        return node_id()

    def step(self, batch: list) -> tuple[dict[str, Any], int, int] | None:
        """Learner.step; rank 0 returns (metrics, version, skipped steps)."""
        metrics = self.learner.step(batch)
        return (metrics, self.learner.version, self.learner.skipped_steps) if self.rank == 0 else None

    def inspection_record(self, batch: list, tokenizer: str) -> dict[str, Any] | None:
        """``trainer.inspect.record_step`` under this group's current weights (every rank runs the same
        forwards, which FSDP2's all-gathers need); rank 0 returns the record."""
        from rz_agents.runtime.factories import build_tokenizer
        from rz_agents.trainer.inspect import record_step

        decode_piece: Any = str
        if self.rank == 0:
            tok, _ = build_tokenizer(tokenizer, self.spec.checkpoint)
            decode_piece = lambda t: tok.decode([t])  # noqa: E731
        plan = self.plan
        record = record_step(
            self.learner.model, batch, plan.learner, self.learner.version, decode_piece,
            sampling=plan.sampling, max_lag=plan.lag.bound,
        )  # fmt: skip
        return record if self.rank == 0 else None

    def published_names(self) -> list[str] | None:
        """Learner.published_names (None: a publication holds every weight)."""
        return self.learner.published_names()

    def weights(self, published: bool = True) -> list | None:
        """The learner's ``WeightUpdate`` (``published``: ``Learner.weight_update``, only the trained part and
        the claim on the frozen rest with a frozen one) or the whole weights as one (a collective, gathered
        tensor by tensor); rank 0 copies each tensor to the host as it arrives, puts the record in the object
        store (one ``ray.put``) and returns ``[reference, bytes]`` (in a list, so that Ray hands the driver
        the reference, not the tensors). The other ranks drop each at once."""
        claim = self.learner.held_claim() if published else None  # (a collective: before the gathers)
        host: dict[str, torch.Tensor] = {}
        stream = self.learner.iter_published() if published else self.learner.iter_weights()
        for name, tensor in stream:
            if self.rank == 0:
                host[name] = tensor.detach().to("cpu")
        if self.rank != 0:
            return None
        update = WeightUpdate(self.learner.version, host, claim)
        return [ray.put(update), update.nbytes]

    def save_state(self, folder: str) -> dict[str, Any] | None:
        """Learner.save_state: every rank writes its own shards into ``folder`` (a collective; the folder must
        be one filesystem for all ranks); rank 0 returns the rest of the state."""
        state = self.learner.save_state(folder)
        return state if self.rank == 0 else None

    def load_state(self, state: dict[str, Any], folder: str | None) -> None:
        """Learner.load_state: every rank reads its own shards from ``folder`` (None: cuts them from the
        whole tensors of a checkpoint from before folders)."""
        self.learner.load_state(state, folder)

    def replace_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Learner.replace_weights."""
        self.learner.replace_weights(weights)

    def open_broadcast(self, address: str, world: int, backend: str) -> None:
        """(rank 0) Serve the weights group's rendezvous at ``address`` and join it as its root."""
        from rz_agents.runtime.ray.weight_broadcast import WeightBroadcast

        self.broadcast = WeightBroadcast(address, 0, world, backend)

    def broadcast_weights(self) -> int | None:
        """The learner's ``WeightUpdate`` (a collective of the learner ranks, gathered tensor by tensor in the
        broadcast's bucket order), broadcast by rank 0 to the engines bucket by bucket (weight_broadcast.py:
        the claim on a frozen rest travels as one more 32-byte entry); rank 0 returns the bytes sent."""
        from rz_agents.runtime.ray.weight_broadcast import (
            BUCKET_BYTES,
            buckets,
            published_layout,
            wire_stream,
        )

        shapes = published_layout(self.learner.weight_shapes(), self.learner.published_names())
        bucket_bytes = self.broadcast.bucket_bytes if self.rank == 0 else BUCKET_BYTES
        order = [name for _, entries in buckets(shapes, bucket_bytes) for name, _ in entries]
        claim = self.learner.held_claim()  # (a collective: before the gathers)
        stream = wire_stream(order, self.learner.iter_published, claim)
        if self.rank == 0:
            self.broadcast.send(shapes, stream)
            return sum(t.numel() * t.element_size() for t in shapes.values())
        for _ in stream:  # join each gather; keep nothing
            pass
        return None

    def close_broadcast(self) -> None:
        """(rank 0) Leave the weights group."""
        broadcast = getattr(self, "broadcast", None)
        if broadcast is not None:
            broadcast.close()
            self.broadcast = None

    def stop(self) -> None:
        """Leave the process group."""
        if self.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


class LearnerGroup:
    """The driver's handle on the learner ranks: ``step``, the published weights, checkpoints.

    ``store_weights``: after each step, put the new weights in the object store at once (the engines
    fetch them from there); off while the weights travel by broadcast, then ``weights_ref`` makes the
    reference on demand (exports, checkpoints of the fixed-lag history)."""

    def __init__(self, actors: list[Any], store_weights: bool = True) -> None:
        self.actors = actors
        self.version = 0
        self.skipped_steps = 0
        self.store_weights = store_weights
        self.published_bytes = 0  # bytes of the latest publication put in the store
        address = ray.get(actors[0].rendezvous.remote()) if len(actors) > 1 else None
        self.nodes = self._get([a.start.remote(address) for a in actors])
        # What a publication holds (None: every weight; else the trained part: LoRA's adapters, all but a
        # frozen vision tower; ``full_weights_ref`` has all of them)
        self.published_names: list[str] | None = ray.get(actors[0].published_names.remote())
        self._ref: tuple[Any, int] | None = None  # (object ref of the published weights, their version)
        self.weights_ref()

    def _get(self, refs: list) -> list:
        """ray.get that fails as soon as one rank fails (the others may be blocked in a collective)."""
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                ray.get(done[0])
            return ray.get(refs)
        except RayActorError as e:
            raise LearnerLost(f"a learner rank died: {e}") from e

    async def _await(self, refs: list) -> list:
        """``_get`` without blocking the event loop."""
        return await asyncio.to_thread(self._get, refs)

    async def step(self, batch: list) -> dict[str, Any]:
        """Learner.step on every rank (one copy of the batch in the object store), then the new weights."""
        ref = ray.put(batch)
        results = await self._await([a.step.remote(ref) for a in self.actors])
        metrics, self.version, self.skipped_steps = results[0]
        if self.store_weights and self.cached_ref() is None:
            results = await self._await([a.weights.remote() for a in self.actors])
            self._stored(results[0])
        return metrics

    def _stored(self, result: list) -> None:
        ref, self.published_bytes = result
        self._ref = (ref, self.version)

    async def inspection_record(self, batch: list, tokenizer: str) -> dict[str, Any]:
        """The trajectory inspector's record of ``batch`` under the current weights (computed on the
        ranks)."""
        ref = ray.put(batch)
        return (await self._await([a.inspection_record.remote(ref, tokenizer) for a in self.actors]))[0]

    def cached_ref(self) -> Any:
        """The object ref of the current weights, if they are in the store already (else None)."""
        return self._ref[0] if self._ref is not None and self._ref[1] == self.version else None

    def weights_ref(self) -> Any:
        """The object ref of the current published weights (with a frozen part the trained one only), gathered
        into the
        store if they are not yet."""
        if self.cached_ref() is None:
            self._stored(self._get([a.weights.remote() for a in self.actors])[0])
        return self._ref[0]

    def full_weights_ref(self) -> Any:
        """The object ref of the whole current weights (``weights_ref`` unless publications are partial: then
        put in the store now, the frozen part and the trained one)."""
        if not self.partial:
            return self.weights_ref()
        return self._get([a.weights.remote(False) for a in self.actors])[0][0]

    def full_weights(self) -> dict[str, torch.Tensor]:
        """The whole current weights as tensors (``full_weights_ref``'s record, fetched here)."""
        return dict(ray.get(self.full_weights_ref()).tensors)

    @property
    def partial(self) -> bool:
        """A publication leaves the frozen part out (LoRA, ``learner.freeze_vision``)."""
        return self.published_names is not None

    async def weights_ref_async(self) -> Any:
        """``weights_ref`` without blocking the event loop."""
        return await asyncio.to_thread(self.weights_ref)

    def save_state(self, folder: str | Path) -> dict[str, Any]:
        """Every rank writes its own shards of the learner's tensors into ``folder`` (``Learner.save_state``;
        nothing is gathered); returns the rest of the state (rank 0's)."""
        return self._get([a.save_state.remote(str(folder)) for a in self.actors])[0]

    def load_state(self, state: dict[str, Any], folder: str | Path | None) -> None:
        """Every rank reads its own shards from ``folder`` (written by any number of ranks); ``folder`` None:
        ``state`` holds the whole tensors (a checkpoint from before folders; one copy in the object store)."""
        if folder is None:
            ref = ray.put(state)
            self._get([a.load_state.remote(ref, None) for a in self.actors])
        else:
            self._get([a.load_state.remote(state, str(folder)) for a in self.actors])
        self._loaded(state)

    def _loaded(self, state: dict[str, Any]) -> None:
        self.version = int(state["version"])
        self.skipped_steps = int(state["skipped_steps"])
        self._ref = None
        self.weights_ref()

    def replace_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Every rank takes ``weights`` (same version: Learner.replace_weights)."""
        ref = ray.put(weights)
        self._get([a.replace_weights.remote(ref) for a in self.actors])
        self._ref = None
        self.weights_ref()

    def close(self) -> None:
        """Leave the process group and end the rank actors."""
        try:
            ray.get([a.stop.remote() for a in self.actors], timeout=30)
        except Exception as e:  # a dead or hung rank: killed below anyway
            log.warning("learner ranks did not stop cleanly: %r", e)
        for actor in self.actors:
            ray.kill(actor)
