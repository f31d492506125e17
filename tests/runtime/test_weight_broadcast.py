"""The broadcast transport: weights travel bucket by bucket, bitwise, from a sender that never holds them
all."""

from __future__ import annotations

import socket
import threading
import weakref

import torch

from rz_agents.runtime.ray.weight_broadcast import WeightBroadcast, buckets


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(64, 32, generator=g).to(torch.bfloat16),  # 4 KiB
        "b.weight": torch.randn(16, generator=g).to(torch.bfloat16),
        "c.big": torch.randn(128, 64, generator=g).to(torch.bfloat16),  # 16 KiB: larger than a bucket
        "d.bias": torch.randn(8, generator=g),  # fp32: a bucket of its own dtype
        "e.weight": torch.randn(32, 32, generator=g).to(torch.bfloat16),
    }


def test_buckets_hold_one_dtype_and_at_most_the_budget_unless_one_tensor_is_larger():
    plan = buckets(_state(), bucket_bytes=6 * 1024)
    names = [[n for n, _ in entries] for _, entries in plan]
    assert names == [["a.weight", "b.weight"], ["c.big"], ["e.weight"], ["d.bias"]]
    assert [d for d, _ in plan] == [torch.bfloat16] * 3 + [torch.float32]
    meta = {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in _state().items()}
    assert buckets(meta, 6 * 1024) == plan  # both sides plan from names, shapes and dtypes alone


def test_a_streamed_broadcast_arrives_bitwise_and_the_sender_holds_one_bucket_at_a_time():
    state = _state()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    bucket = 6 * 1024
    members: dict[int, WeightBroadcast] = {}
    threads = [
        threading.Thread(
            target=lambda r=r: members.__setitem__(r, WeightBroadcast(address, r, 2, "gloo", 30, bucket))
        )
        for r in (0, 1)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    alive: list[weakref.ref] = []
    most_alive = 0

    def stream():  # fresh copies, as a gather would make them; count how many are still held
        nonlocal most_alive
        for _, entries in buckets(state, bucket):
            for name, _ in entries:
                most_alive = max(most_alive, sum(r() is not None for r in alive))
                tensor = state[name].clone()
                alive.append(weakref.ref(tensor))
                yield name, tensor

    received: dict = {}
    meta = {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in state.items()}
    like = {k: torch.empty_like(v) for k, v in state.items()}
    rx = threading.Thread(target=lambda: received.update(members[1].receive(like)))
    rx.start()
    members[0].send(meta, stream())
    rx.join()
    for m in members.values():
        m.close()
    assert set(received) == set(state)
    assert all(torch.equal(received[k], v) and received[k].dtype == v.dtype for k, v in state.items())
    assert (
        most_alive <= 1
    )  # the largest bucket here holds two tensors: the first is still alive at the second
