"""Triton GEMM: close to F.linear, and each row's result independent of how many rows share the call."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from rz_kernels.triton_ops import gemm  # noqa: E402

BATCHES = (1, 7, 64, 129)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_matches_torch_linear(dtype):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(72, 80, generator=gen).to(dtype)
    x = torch.randn(70, 80, generator=gen).to(dtype)
    out = gemm.matmul(x, w)
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), F.linear(x.float(), w.float()), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_row_alone_equals_row_in_batches_across_tile_configs(dtype):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(40, 96, generator=gen).to(dtype)
    x = torch.randn(max(BATCHES), 96, generator=gen).to(dtype)
    alone = [gemm.matmul(x[i : i + 1], w)[0] for i in (0, 5, 63, 128)]
    configs = {gemm.config_for(dtype, m) for m in BATCHES}
    assert len(configs) >= 3  # the batch sizes cross the per-M tile configs
    for m in BATCHES:
        out = gemm.matmul(x[:m], w)
        for i, row in zip((0, 5, 63, 128), alone, strict=True):
            if i < m:
                assert torch.equal(out[i], row), (m, i)


def test_every_config_of_a_dtype_shares_block_k():
    for dtype, rows in gemm.GEMM_CONFIGS.items():
        assert len({cfg.block_k for _, cfg in rows}) == 1, dtype


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
