"""Triton MoE: grouped GEMM close to the CPU aligned MoE, a token's output independent of the others
routed with it, gradients close to autograd through per-expert torch GEMMs and the same bits twice, the
expert grouping built on the device (nothing read back to the host, forward or backward)."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from rz_kernels import moe as cpu_moe  # noqa: E402
from rz_kernels.triton_ops import moe as tm  # noqa: E402

E, HIDDEN, INTER, TOP_K = 8, 32, 48, 2


def _experts(dtype, gen, requires_grad=False):
    def make(shape):
        return (torch.randn(shape, generator=gen) * 0.2).to(dtype).requires_grad_(requires_grad)

    return (
        [make((INTER, HIDDEN)) for _ in range(E)],
        [make((INTER, HIDDEN)) for _ in range(E)],
        [make((HIDDEN, INTER)) for _ in range(E)],
    )


def _reference_fn(weights):
    gate, up, down = weights
    return lambda e, xe: F.linear(F.silu(F.linear(xe, gate[e])) * F.linear(xe, up[e]), down[e])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_moe_matches_cpu_moe_and_tokens_are_independent(dtype):
    gen = torch.Generator().manual_seed(0)
    weights = _experts(dtype, gen)
    x = torch.randn(70, HIDDEN, generator=gen).to(dtype)
    logits = torch.randn(70, E, generator=gen)
    w, ex = tm.route(logits, TOP_K, True)
    w_ref, ex_ref = cpu_moe.route(logits, TOP_K, True)
    assert torch.equal(ex, ex_ref)
    torch.testing.assert_close(w, w_ref, rtol=1e-6, atol=1e-6)
    out = tm.aligned_moe(x, w, ex, E, expert_weights=weights)
    ref = cpu_moe.aligned_moe(x, w, ex, E, _reference_fn(weights))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)
    for i in (0, 33, 69):  # alone, or with a different crowd routed alongside
        assert torch.equal(
            tm.aligned_moe(x[i : i + 1], w[i : i + 1], ex[i : i + 1], E, expert_weights=weights)[0], out[i]
        )
    assert torch.equal(tm.aligned_moe(x[30:37], w[30:37], ex[30:37], E, expert_weights=weights), out[30:37])


def test_grouped_moe_gradients_match_per_expert_autograd():
    gen = torch.Generator().manual_seed(1)
    weights = _experts(torch.float32, gen, requires_grad=True)
    x = torch.randn(20, HIDDEN, generator=gen, requires_grad=True)
    logits = torch.randn(20, E, generator=gen, requires_grad=True)
    g = torch.randn(20, HIDDEN, generator=gen)
    params = [x, logits, *weights[0], *weights[1], *weights[2]]

    w, ex = tm.route(logits, TOP_K, True)
    tm.aligned_moe(x, w, ex, E, expert_weights=weights).backward(g)
    ours = [None if p.grad is None else p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    w, ex = cpu_moe.route(logits, TOP_K, True)
    cpu_moe.aligned_moe(x, w, ex, E, _reference_fn(weights)).backward(g)
    for a, p in zip(ours, params, strict=True):
        if p.grad is None:
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-5)


def test_grouped_moe_backward_is_one_grouped_launch_per_weight_without_index_add_and_the_same_bits_twice(
    monkeypatch,
):
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    launches = Counter()
    for name in ("grouped_matmul", "grouped_weight_grad"):
        real = getattr(tm, name)
        monkeypatch.setattr(
            tm, name, lambda *a, _real=real, _name=name, **k: launches.update([_name]) or _real(*a, **k)
        )
    gen = torch.Generator().manual_seed(2)
    weights = _experts(torch.bfloat16, gen, requires_grad=True)
    x = torch.randn(24, HIDDEN, generator=gen).to(torch.bfloat16).requires_grad_(True)
    logits = torch.randn(24, E, generator=gen)
    g = torch.randn(24, HIDDEN, generator=gen).to(torch.bfloat16)
    params = [x, *weights[0], *weights[1], *weights[2]]
    runs = []
    for _ in range(2):
        for p in params:
            p.grad = None
        w, ex = tm.route(logits, TOP_K, True)
        out = tm.aligned_moe(x, w, ex, E, expert_weights=weights)
        ops = Ops()
        launches.clear()
        with ops:
            out.backward(g)
        runs.append([None if p.grad is None else p.grad.clone() for p in params])
    # every expert's weight gradient from one grouped launch per projection (gate, up, down), the input
    # gradients from one transposed grouped GEMM each; no per-expert mm, no scatter-add for the gathered rows
    assert launches == Counter(grouped_weight_grad=3, grouped_matmul=3), launches
    assert ops.seen["mm"] == 0 and ops.seen["bmm"] == 0, ops.seen
    assert ops.seen["index_add"] == 0 and ops.seen["index_add_"] == 0, ops.seen
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_the_tile_table_is_built_on_the_device_with_a_grid_bound_from_the_shapes():
    block = 4
    flat = torch.tensor([3, 0, 3, 3, 1, 3, 3, 0, 3, 3])  # expert 2 unused; runs of 2, 1, 0, 7 rows
    grouping = tm.group_by_expert(flat, 4, block)
    assert torch.equal(grouping.order, torch.sort(flat, stable=True).indices)
    assert grouping.run_start.tolist() == [0, 2, 3, 3] and grouping.run_end.tolist() == [2, 3, 3, 10]
    # the runs cut into 4-row tiles from each run's start (what the host-built table held), then empty tiles
    # up to the bound: 10 // 4 full tiles + at most one partial tile per expert
    bound = tm.max_tiles(10, 4, block)
    assert bound == 6 and grouping.tile_row0.numel() == bound
    tiles = list(
        zip(
            grouping.tile_expert.tolist(),
            grouping.tile_row0.tolist(),
            grouping.tile_row1.tolist(),
            strict=True,
        )
    )
    assert tiles[:4] == [(0, 0, 2), (1, 2, 3), (3, 3, 7), (3, 7, 10)]
    assert all(r0 == r1 for _, r0, r1 in tiles[4:])
    # the bound holds for any routing: every row in one expert, or every expert a partial tile
    for flat in (torch.zeros(9, dtype=torch.long), torch.arange(8) % 8, torch.randint(0, 5, (37,))):
        g = tm.group_by_expert(flat, 8, block)
        real = sum(-(-n // block) for n in torch.bincount(flat, minlength=8).tolist())
        assert int((g.tile_row1 > g.tile_row0).sum()) == real <= tm.max_tiles(flat.numel(), 8, block)


def _host_reads(monkeypatch, run) -> list[str]:
    """Calls that read a tensor back to the host (``tolist``, ``item``, ``int()`` / ``float()`` / ``bool()``
    of a tensor; ``torch.unique``, ``bincount`` and ``nonzero``, which on CUDA read a size back to the host)
    made by the package's code while ``run()`` runs (the interpreter's own reads, which a GPU launch does not
    make, are left out)."""
    import sys

    reads: list[str] = []

    def spy(owner, name):
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if "rz_kernels" in caller and "interpreter" not in caller or "rz_agents" in caller:
                reads.append(f"{name} at {caller}:{sys._getframe(1).f_lineno}")
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    for name in ("tolist", "item", "__int__", "__float__", "__bool__"):
        spy(torch.Tensor, name)
    for name in ("unique", "bincount", "nonzero"):
        spy(torch, name)
    spy(torch.Tensor, "nonzero")
    run()
    monkeypatch.undo()
    return reads


def test_the_moe_forward_and_backward_read_nothing_back_to_the_host(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    weights = _experts(torch.float32, gen, requires_grad=True)
    x = torch.randn(19, HIDDEN, generator=gen, requires_grad=True)
    logits = torch.randn(19, E, generator=gen, requires_grad=True)

    def forward_backward():
        w, ex = tm.route(logits, TOP_K, True)
        tm.aligned_moe(x, w, ex, E, expert_weights=weights).sum().backward()

    assert _host_reads(monkeypatch, forward_backward) == []
    assert x.grad is not None and all(w.grad is not None for w in weights[0])  # (it did run)
    # the spy sees a read where there is one (what the grouping did before: bincount(...).tolist())
    assert _host_reads(monkeypatch, lambda: cpu_moe.aligned_moe(x, *tm.route(logits, TOP_K, True), E,
                                                                _reference_fn(weights)))  # fmt: skip


def test_an_moe_model_train_step_on_the_triton_op_set_gives_the_same_gradient_bits_twice():
    from rz_agents.model import ModelConfig, Transformer
    from rz_agents.model.logprobs import packed_token_logprobs

    shape = dict(
        vocab_size=200, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
    )
    model = Transformer(ModelConfig.tiny("qwen3_moe", dtype="float32", **shape), kernels="triton")
    model.reset_parameters(std=0.1, seed=0)
    seqs = [torch.tensor(s) for s in ([1, 5, 9, 13, 2, 7], [4, 4, 8, 15, 16])]
    runs = []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        sum(lp.sum() for lp in packed_token_logprobs(model, seqs)).backward()
        runs.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert runs[0].keys() == runs[1].keys() and len(runs[0]) > 10
    assert all(torch.equal(g, runs[1][n]) for n, g in runs[0].items())
