"""Weights from learner rank 0 to every engine replica as torch.distributed broadcasts
(``placement.weight_transport: broadcast``): NCCL when the learner and the engines are on GPUs, gloo on CPU.

Rank 0 and the E replicas form their own group (size 1 + E, rank 0 the root), apart from the learner's FSDP
group. A publication is one broadcast per dtype of all the weights flattened into one buffer, in an order
both sides derive from the model's state dict (names sorted), so nothing but the tensors' bytes travels.
Membership is fixed: once a replica dies (Ray restarts it as a new process), the group is given up and the
runtime publishes through the object store from then on.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping

import torch
import torch.distributed as dist

Layout = list[tuple[torch.dtype, list[tuple[str, torch.Size]]]]


def layout(state: Mapping[str, torch.Tensor]) -> Layout:
    """The tensors of ``state`` grouped by dtype (in a fixed order), names sorted within each dtype."""
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Size]]] = {}
    for name in sorted(state):
        by_dtype.setdefault(state[name].dtype, []).append((name, state[name].shape))
    return sorted(by_dtype.items(), key=lambda item: str(item[0]))


class WeightBroadcast:
    """One member of the weights group: rank 0 sends, the other ranks receive."""

    def __init__(self, address: str, rank: int, world: int, backend: str, timeout_s: float = 120.0) -> None:
        """``address``: tcp://host:port, where rank 0 serves the group's rendezvous store."""
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

    def send(self, state: Mapping[str, torch.Tensor]) -> None:
        """(rank 0) Broadcast ``state`` to every other member."""
        for _dtype, entries in layout(state):
            flat = torch.cat([state[name].reshape(-1) for name, _ in entries])
            self.group.broadcast(flat, 0).wait()

    def receive(self, like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Receive a state laid out like ``like`` (same names, shapes and dtypes, e.g. the engine's model)."""
        out: dict[str, torch.Tensor] = {}
        device = next(iter(like.values())).device
        for dtype, entries in layout(like):
            flat = torch.empty(sum(shape.numel() for _, shape in entries), dtype=dtype, device=device)
            self.group.broadcast(flat, 0).wait()
            offset = 0
            for name, shape in entries:
                out[name] = flat[offset : offset + shape.numel()].view(shape)
                offset += shape.numel()
        return out

    def close(self) -> None:
        """Leave the group (after a failure its members may be stuck: do not wait for them)."""
        try:
            self.group.abort()
        except Exception:  # already broken
            pass
