"""The Triton MoE's expert pointer table is a device tensor made once per set of expert addresses and reused,
so a CUDA-graph capture of an MoE decode step (whose warm-up runs the step first) allocates no pinned memory
and copies nothing from the host; a miss during a capture raises instead of baking a host copy into the graph;
a table a graph captured is never evicted. The grouped MoE keeps its bits with the cached tables."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from rz_kernels.triton_ops import moe as tm  # noqa: E402


@pytest.fixture(autouse=True)
def _empty_tables(monkeypatch):
    monkeypatch.setattr(tm, "_POINTER_TABLES", type(tm._POINTER_TABLES)())
    monkeypatch.setattr(tm, "_CAPTURED_TABLES", set())


def _weights(n: int = 4) -> list[torch.Tensor]:
    return [torch.zeros(8, 4) for _ in range(n)]


def test_the_table_holds_the_addresses_and_is_made_once(monkeypatch):
    weights = _weights()
    first = tm.pointer_table(weights, torch.device("cpu"))
    assert first.tolist() == [w.data_ptr() for w in weights] and first.dtype == torch.int64

    def no_host_table(*args, **kwargs):  # a hit builds nothing on the host (and so pins nothing)
        raise AssertionError("a cache hit built a host tensor")

    monkeypatch.setattr(torch, "tensor", no_host_table)
    assert tm.pointer_table(weights, torch.device("cpu")) is first


def test_during_a_capture_a_hit_is_reused_and_a_miss_raises(monkeypatch):
    built = _weights()
    table = tm.pointer_table(built, torch.device("cpu"))  # the warm-up before the capture
    monkeypatch.setattr(tm, "_capturing", lambda device: True)
    assert tm.pointer_table(built, torch.device("cpu")) is table
    with pytest.raises(RuntimeError, match="during a CUDA-graph capture"):
        tm.pointer_table(_weights(), torch.device("cpu"))


def test_tables_a_graph_captured_survive_eviction(monkeypatch):
    monkeypatch.setattr(tm, "MAX_POINTER_TABLES", 2)
    kept = _weights()
    tm.pointer_table(kept, torch.device("cpu"))
    monkeypatch.setattr(tm, "_capturing", lambda device: True)
    table = tm.pointer_table(kept, torch.device("cpu"))  # used by a capture: pinned in the cache
    monkeypatch.setattr(tm, "_capturing", lambda device: False)
    alive = [_weights() for _ in range(4)]  # (alive: their addresses stay distinct)
    for weights in alive:
        tm.pointer_table(weights, torch.device("cpu"))
    assert len(tm._POINTER_TABLES) == 2
    assert tm.pointer_table(kept, torch.device("cpu")) is table


def test_the_grouped_moe_gives_the_same_bits_with_a_cached_table():
    gen = torch.Generator().manual_seed(0)
    experts, hidden, inter, tokens, top_k = 4, 16, 24, 10, 2
    weights = tuple(
        [(torch.randn(shape, generator=gen) * 0.2) for _ in range(experts)]
        for shape in ((inter, hidden), (inter, hidden), (hidden, inter))
    )
    x = torch.randn(tokens, hidden, generator=gen)
    w, ex = tm.route(torch.randn(tokens, experts, generator=gen), top_k, True)
    cold = tm.aligned_moe(x, w, ex, experts, expert_weights=weights)
    assert len(tm._POINTER_TABLES) == 3  # gate, up, down
    warm = tm.aligned_moe(x, w, ex, experts, expert_weights=weights)
    assert len(tm._POINTER_TABLES) == 3 and torch.equal(cold, warm)
