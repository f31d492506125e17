"""Weights from learner rank 0 to every engine replica as torch.distributed broadcasts
(``actors.weight_transport: broadcast``): NCCL when the learner and the engines are on GPUs, gloo on CPU.

Rank 0 and the E replicas form their own group (size 1 + E, rank 0 the root), apart from the learner's FSDP
group. A publication is a series of bucket broadcasts (``buckets``: tensors of one dtype, names sorted, packed
up to ``bucket_bytes``; a larger tensor travels alone and uncopied), in an order both sides derive from the
model's state dict, so nothing but the tensors' bytes travels. The sender takes the tensors one at a time
(``Learner.iter_weights``: gathered one by one under FSDP2), so it never holds more than one bucket beyond
its model; a receiver holds what it received (one staging copy of the whole state, tied embeddings twice: its
engine keeps generating with the old weights meanwhile; runtime/memory_estimate.py counts it per replica as
``weight_receive_staging``).
Membership is fixed: once a replica dies (Ray restarts it as a new process), the group is given up and the
runtime publishes through the object store from then on.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist

from rz_agents.model.held_weights import HELD_KEY, claim_tensor

Layout = list[tuple[torch.dtype, list[tuple[str, torch.Size]]]]
BUCKET_BYTES = 256 * 2**20


def layout(state: Mapping[str, torch.Tensor]) -> Layout:
    """The tensors of ``state`` grouped by dtype (in a fixed order), names sorted within each dtype."""
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Size]]] = {}
    for name in sorted(state):
        by_dtype.setdefault(state[name].dtype, []).append((name, state[name].shape))
    return sorted(by_dtype.items(), key=lambda item: str(item[0]))


def buckets(state: Mapping[str, torch.Tensor], bucket_bytes: int = BUCKET_BYTES) -> Layout:
    """``layout(state)`` cut into broadcasts: runs of one dtype totalling at most ``bucket_bytes`` (a tensor
    larger than that is a bucket of its own). ``state`` may hold meta tensors: only names, shapes and dtypes
    count."""
    out: Layout = []
    for dtype, entries in layout(state):
        size = torch.empty(0, dtype=dtype).element_size()
        used = bucket_bytes + 1
        for name, shape in entries:
            nbytes = shape.numel() * size
            if used + nbytes > bucket_bytes:
                out.append((dtype, []))
                used = 0
            out[-1][1].append((name, shape))
            used += nbytes
    return out


def published_layout(
    like: Mapping[str, torch.Tensor], published: Sequence[str] | None
) -> dict[str, torch.Tensor]:
    """What a publication of ``published`` (``Learner.published_names``; None: every weight) broadcasts, laid
    out like ``like`` (the model's state, or meta tensors): those tensors and, when they are a part, the claim
    on the rest (``HELD_KEY``, 32 bytes). The sender and every receiver derive the buckets from it."""
    if published is None:
        return dict(like)
    out = {name: like[name] for name in published}
    device = next(iter(like.values())).device
    out[HELD_KEY] = torch.empty(32, dtype=torch.uint8, device=device)
    return out


def wire_stream(
    order: Sequence[str],
    tensors: Callable[[list[str]], Iterable[tuple[str, torch.Tensor]]],
    claim: str | None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs in the broadcast's ``order``: ``tensors(names)`` (every name of ``order`` but the
    claim's, in that order: ``Learner.iter_published``) with a partial update's ``claim`` (its
    ``held_sha256``) placed where ``HELD_KEY`` falls. The claim is a tensor on this wire only."""
    names = [n for n in order if n != HELD_KEY]
    stream = iter(tensors(names))
    for name in order:
        if name == HELD_KEY:
            if claim is None:
                raise ValueError("weight broadcast: the layout has a claim entry, the update claims nothing")
            yield name, claim_tensor(claim)
        else:
            yield next(stream)


class WeightBroadcast:
    """One member of the weights group: rank 0 sends, the other ranks receive."""

    def __init__(
        self,
        address: str,
        rank: int,
        world: int,
        backend: str,
        timeout_s: float = 120.0,
        bucket_bytes: int = BUCKET_BYTES,
    ) -> None:
        """``address``: tcp://host:port, where rank 0 serves the group's rendezvous store. Every member must
        use the same ``bucket_bytes``."""
        self.bucket_bytes = bucket_bytes
        host, port = address.removeprefix("tcp://").rsplit(":", 1)
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, int(port), world, is_master=rank == 0, timeout=timeout)
        store = dist.PrefixStore("rz_weights", store)
        if backend == "nccl":
            self.group = dist.ProcessGroupNCCL(store, rank, world)
        else:
            self.group = dist.ProcessGroupGloo(store, rank, world, timeout)
        self.rank = rank
        self._store = store  # rank 0's store serves the others: keep it alive

    def send(
        self, state: Mapping[str, torch.Tensor], tensors: Iterable[tuple[str, torch.Tensor]] | None = None
    ) -> None:
        """(rank 0) Broadcast the weights laid out like ``state`` to every other member, bucket by bucket.

        ``tensors``: (name, tensor) pairs in ``buckets(state)`` order, produced as they are sent (then
        ``state`` may be meta tensors of the same names, shapes and dtypes); default: ``state``'s own."""
        stream = (
            iter(tensors)
            if tensors is not None
            else ((n, state[n]) for _, b in self._plan(state) for n, _ in b)
        )
        for _dtype, entries in self._plan(state):
            parts = []
            for name, shape in entries:
                got, tensor = next(stream)
                if got != name or tensor.shape != shape:
                    raise ValueError(
                        f"weight broadcast: expected {name} {tuple(shape)}, got {got} {tuple(tensor.shape)}"
                    )
                parts.append(tensor.reshape(-1))
            flat = parts[0].contiguous() if len(parts) == 1 else torch.cat(parts)
            self.group.broadcast(flat, 0).wait()
            del parts, flat  # this bucket is gone before the next one is gathered

    def receive(self, like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Receive a state laid out like ``like`` (same names, shapes and dtypes, e.g. the engine's model)."""
        out: dict[str, torch.Tensor] = {}
        device = next(iter(like.values())).device
        for dtype, entries in self._plan(like):
            flat = torch.empty(sum(shape.numel() for _, shape in entries), dtype=dtype, device=device)
            self.group.broadcast(flat, 0).wait()
            offset = 0
            for name, shape in entries:
                out[name] = flat[offset : offset + shape.numel()].view(shape)
                offset += shape.numel()
        return out

    def _plan(self, state: Mapping[str, torch.Tensor]) -> Layout:
        return buckets(state, self.bucket_bytes)

    def close(self) -> None:
        """Leave the group (after a failure its members may be stuck: do not wait for them)."""
        try:
            self.group.abort()
        except Exception:  # already broken
            pass
