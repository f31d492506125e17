"""The Triton interpreter's cost per delta-rule launch, with and without triton.language patched once per
device function per launch (rz_kernels.triton_ops.interpreter), in one run.

    python bench/triton_interpreter.py            # KDA and the scalar delta rule, one chunk, one head

The interpreter re-patches triton.language at every call of a @triton.jit device function (tl.sum,
tl.cumsum, the forward substitution's helper): the delta-rule kernels' forward substitution calls tl.sum
twice per row. Prints each launch's median seconds both ways and the ratio; the outputs of both ways are
compared with torch.equal (the patch changes no arithmetic).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "kernels"):
    sys.path.insert(0, str(p))
os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
from triton.runtime import interpreter as interp  # noqa: E402

from rz_kernels.delta_rule import l2_normalize  # noqa: E402
from rz_kernels.triton_ops.interpreter import patch_interpreter  # noqa: E402


def _time(fn, repeats: int) -> tuple[float, torch.Tensor]:
    out, times = fn(), []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    torch.set_num_threads(1)
    original = (interp._patch_lang, interp.GridExecutor.__call__)
    patch_interpreter()
    patched = (interp._patch_lang, interp.GridExecutor.__call__)
    from rz_kernels.triton_ops.delta_rule import gated_delta_rule

    gen = torch.Generator().manual_seed(0)
    t, h, dk, dv = 20, 1, 16, 16
    q, k = (l2_normalize(torch.randn(t, h, dk, generator=gen)) for _ in range(2))
    v, beta = torch.randn(t, h, dv, generator=gen), torch.rand(t, h, generator=gen)
    g = -0.3 * torch.rand(t, h, dk, generator=gen)
    for name, decay in (("kda", g), ("gated_delta_rule", g[..., 0].contiguous())):

        def run(decay=decay):
            return gated_delta_rule(q, k, v, decay, beta, [t])[0]

        interp._patch_lang, interp.GridExecutor.__call__ = patched
        fast, a = _time(run, 5)
        interp._patch_lang, interp.GridExecutor.__call__ = original
        slow, b = _time(run, 5)
        interp._patch_lang, interp.GridExecutor.__call__ = patched
        assert torch.equal(a, b)
        print(f"{name}: {slow:.3f} s per launch as triton ships, {fast:.3f} s patched once per launch: "
              f"{slow / fast:.2f}x faster, outputs equal")  # fmt: skip


if __name__ == "__main__":
    main()
