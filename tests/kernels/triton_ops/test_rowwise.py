"""RMSNorm, RoPE, SiLU-mul (one program per row): close to the CPU op set, row alone == row in a batch,
gradients close to autograd through the CPU op set."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from rz_kernels import RopeTable, activation, norm  # noqa: E402
from rz_kernels.triton_ops import rowwise  # noqa: E402

BATCHES = (1, 7, 64, 129)


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_cpu_op_and_is_row_invariant(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(129, 48, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(48, generator=gen)).to(dtype)
    full = rowwise.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(full, norm.rms_norm(x, w, 1e-6), **_tol(dtype))
    for m in BATCHES:
        assert torch.equal(rowwise.rms_norm(x[:m], w, 1e-6), full[:m]), m


def test_rms_norm_returns_no_view_with_or_without_autograd():
    """The final norm's output is a sharded model's output: FSDP2 warns on every forward when it is a view."""
    gen = torch.Generator().manual_seed(3)
    w = (1 + 0.1 * torch.randn(48, generator=gen)).requires_grad_()
    for shape in ((5, 48), (2, 5, 48)):
        x = torch.randn(*shape, generator=gen)
        for out in (rowwise.rms_norm(x, w.detach(), 1e-6), rowwise.rms_norm(x, w, 1e-6)):
            assert out.shape == x.shape and not out._is_view(), shape
        assert torch.equal(out, rowwise.rms_norm(x.reshape(-1, 48), w, 1e-6).reshape(shape))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_cpu_op_and_is_row_invariant(dtype):
    gen = torch.Generator().manual_seed(1)
    gate = torch.randn(129, 40, generator=gen).to(dtype)
    up = torch.randn(129, 40, generator=gen).to(dtype)
    full = rowwise.silu_mul(gate, up)
    torch.testing.assert_close(full, activation.silu_mul(gate, up), **_tol(dtype))
    for m in BATCHES:
        assert torch.equal(rowwise.silu_mul(gate[:m], up[:m]), full[:m]), m


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_matches_cpu_table_and_depends_only_on_position(dtype):
    gen = torch.Generator().manual_seed(2)
    table = RopeTable(16, 10_000.0, 256)
    x = torch.randn(129, 3, 16, generator=gen).to(dtype)
    pos = torch.randint(0, 256, (129,), generator=gen)
    full = rowwise.rope(table, x, pos)
    torch.testing.assert_close(full, table.apply(x, pos), **_tol(dtype))
    for m in BATCHES:
        assert torch.equal(rowwise.rope(table, x[:m], pos[:m]), full[:m]), m
    with pytest.raises(ValueError, match="max_position_embeddings"):
        rowwise.rope(table, x[:1], torch.tensor([256]))


def test_rope_at_head_dim_72_padded_to_a_power_of_two_matches_the_cpu_table():
    """Qwen3-VL-8B's vision tower: head dim 72 (HALF 36, not a power of two) failed to compile on both
    tritons (tl.arange needs a power of two); the kernel pads HALF to 64 with a mask."""
    gen = torch.Generator().manual_seed(5)
    table = RopeTable(72, 10_000.0, 64)
    x = torch.randn(9, 3, 72, generator=gen)
    pos = torch.randint(0, 64, (9,), generator=gen)
    full = rowwise.rope(table, x, pos)
    torch.testing.assert_close(full, table.apply(x, pos), rtol=1e-5, atol=1e-5)
    assert torch.equal(rowwise.rope(table, x[:4], pos[:4]), full[:4])


def test_rope_reads_strided_row_tables_as_their_values():
    """`RopeTable.from_rows` takes angles gathered elsewhere (multimodal RoPE), which may be strided views;
    the kernel indexes rows as pos * head_dim, so it must see the values, not the storage."""
    gen = torch.Generator().manual_seed(4)
    cos, sin = torch.randn(2, 16, 40, generator=gen)  # [head_dim, rows]: .T is a strided [rows, head_dim]
    strided = RopeTable.from_rows(cos.T, sin.T)
    dense = RopeTable.from_rows(cos.T.contiguous(), sin.T.contiguous())
    assert not strided.cos.is_contiguous()
    x = torch.randn(40, 2, 16, generator=gen)
    pos = torch.arange(40)
    assert torch.equal(rowwise.rope(strided, x, pos), rowwise.rope(dense, x, pos))
    torch.testing.assert_close(rowwise.rope(strided, x, pos), dense.apply(x, pos), rtol=1e-5, atol=1e-5)


def test_rowwise_gradients_match_autograd_through_the_cpu_ops():
    gen = torch.Generator().manual_seed(3)
    table = RopeTable(16, 10_000.0, 64)
    pos = torch.randint(0, 64, (6,), generator=gen)
    x = torch.randn(6, 2, 16, generator=gen, requires_grad=True)
    w = torch.randn(16, generator=gen, requires_grad=True)
    up = torch.randn(6, 2, 16, generator=gen, requires_grad=True)
    g = torch.randn(6, 2, 16, generator=gen)

    def run(rms, rope, silu):
        return silu(rope(rms(x, w, 1e-6), pos), up)

    run(rowwise.rms_norm, lambda h, p: rowwise.rope(table, h, p), rowwise.silu_mul).backward(g)
    ours = [t.grad.clone() for t in (x, w, up)]
    for t in (x, w, up):
        t.grad = None
    run(norm.rms_norm, table.apply, activation.silu_mul).backward(g)
    for a, t in zip(ours, (x, w, up), strict=True):
        torch.testing.assert_close(a, t.grad, rtol=1e-4, atol=1e-5)
