"""The vision tower's ops (Qwen3-VL): LayerNorm and GELU give a row the same bits whatever else is in the
call, and agree with stock PyTorch to rounding."""

import pytest
import torch
import torch.nn.functional as F

from rz_kernels import ALIGNED, STANDARD


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_rows_do_not_depend_on_the_batch(dtype):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(301, 72, generator=gen) * 3 + 1).to(dtype)
    w, b = torch.randn(72, generator=gen), torch.randn(72, generator=gen)
    full = ALIGNED.layer_norm(x, w, b, 1e-6)
    for rows in (1, 2, 3, 17, 64, 200):
        assert torch.equal(ALIGNED.layer_norm(x[:rows], w, b, 1e-6), full[:rows])
    ref = STANDARD.layer_norm(x.float(), w, b, 1e-6)
    assert (full.float() - ref).abs().max() < (1e-5 if dtype == torch.float32 else 5e-2)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_elements_do_not_depend_on_the_tensor_size(approximate):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(999, 37, generator=gen)
    full = ALIGNED.gelu(x, approximate)
    for rows in (1, 5, 130, 998):
        assert torch.equal(ALIGNED.gelu(x[:rows], approximate), full[:rows])
    assert (full - F.gelu(x, approximate=approximate)).abs().max() < 1e-6
