"""Triton GEMM: close to F.linear, and each row's result independent of how many rows share the call."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from rz_kernels.triton_ops import gemm  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_matches_torch_linear(dtype):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(72, 80, generator=gen).to(dtype)
    x = torch.randn(70, 80, generator=gen).to(dtype)
    out = gemm.matmul(x, w)
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), F.linear(x.float(), w.float()), rtol=tol, atol=tol)


ROWS = (1, 7, 16, 24, 64, 130)


def test_one_tile_config_serves_every_m_unless_the_by_m_table_is_asked_for(monkeypatch):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert {gemm.config_for(dtype, m) for m in (1, 16, 24, 64, 512, 16384)} == {gemm.GEMM_CONFIG[dtype]}
    monkeypatch.setattr(gemm, "_tiles", "by_m")
    assert len({gemm.config_for(torch.bfloat16, m) for m in ROWS}) >= 3
    with pytest.raises(ValueError, match="single"):
        gemm.set_gemm_tiles("per_row")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_computed_in_batches_of_1_to_130_rows_equal_the_row_alone(dtype):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(40, 96, generator=gen).to(dtype)
    x = torch.randn(max(ROWS), 96, generator=gen).to(dtype)
    probes = (0, 5, 15, 23, 63, 129)
    alone = {i: gemm.matmul(x[i : i + 1], w)[0] for i in probes}
    for m in ROWS:
        out = gemm.matmul(x[:m], w)
        for i in probes:
            if i < m:
                assert torch.equal(out[i], alone[i]), (m, i)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_by_m_table_rows_equal_in_the_interpreter_across_its_configs(dtype):
    # The interpreter's fixed-order dot makes every config give the same bits: what only a GPU can refute
    # for the by-M table (gpu_check measures it there).
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(40, 96, generator=gen).to(dtype)
    x = torch.randn(129, 96, generator=gen).to(dtype)
    table = gemm.GEMM_CONFIGS_BY_M
    alone = gemm.matmul(x[:1], w, table=table)[0]
    assert len({gemm.config_for(dtype, m, table) for m in (1, 7, 64, 129)}) >= 3
    for m in (1, 7, 64, 129):
        assert torch.equal(gemm.matmul(x[:m], w, table=table)[0], alone), m
    assert torch.equal(gemm.matmul(x[:1], w)[0], alone)


def test_every_config_of_a_dtype_shares_block_k():
    for dtype, rows in gemm.GEMM_CONFIGS_BY_M.items():
        assert {cfg.block_k for _, cfg in rows} == {gemm.GEMM_CONFIG[dtype].block_k}, dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stacked_weights_give_each_parts_columns_bit_for_bit(dtype):
    # fused q/k/v: one GEMM over [q; k; v] (parts not multiples of BLOCK_N, so columns move inside tiles)
    gen = torch.Generator().manual_seed(4)
    parts = [torch.randn(n, 80, generator=gen).to(dtype) for n in (48, 24, 24)]
    stacked = torch.cat(parts)
    x = torch.randn(max(ROWS), 80, generator=gen).to(dtype)
    for m in (1, 7, 24, 130):
        whole = gemm.matmul(x[:m], stacked)
        assert torch.equal(whole, torch.cat([gemm.matmul(x[:m], p) for p in parts], 1)), m


def test_linear_gradients_match_autograd_of_torch_linear():
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(24, 32, generator=gen, requires_grad=True)
    b = torch.randn(24, generator=gen, requires_grad=True)
    x = torch.randn(3, 5, 32, generator=gen, requires_grad=True)
    g = torch.randn(3, 5, 24, generator=gen)
    gemm.linear(x, w, b).backward(g)
    ours = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    F.linear(x, w, b).backward(g)
    for a, t in zip(ours, (x, w, b), strict=True):
        torch.testing.assert_close(a, t.grad, rtol=1e-5, atol=1e-5)
