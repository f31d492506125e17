"""Running the Triton kernels on CPU through the Triton interpreter (tests and `gpu_check --dry-run`).

`TRITON_INTERPRET=1` must be set before the kernel modules are imported (`@triton.jit` reads it).
The interpreter executes a kernel's indexing, masks, loops and reduction order faithfully, but two of
its primitives do not behave like the GPU, and `patch_interpreter` replaces them:

- `tl.dot` is `np.matmul` (BLAS), whose result for one row can depend on the row's position in the
  tile and on the tile's shape — false batch-invariance failures that a GPU's MMA does not have —
  and on bf16 it multiplies raw uint16 bit patterns. The replacement converts inputs to fp32 and
  accumulates one product per k, in k order, into the accumulator: a fixed order per output element,
  like the tensor core's accumulation.
- fp32 -> bf16 casts truncate; the replacement rounds to nearest even, as the GPU (and torch) do.

Nothing here changes a kernel; it makes the CPU model of the machine match the GPU's contract.
"""

from __future__ import annotations

import os

import numpy as np
import torch

_PATCHED = False


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_triton_interprets() -> None:
    """Raise a clear error where TRITON_INTERPRET=1 is set but `triton` was imported before it was.

    `@triton.jit` reads the switch when it decorates, and triton decorates its own library (tl.zeros,
    tl.sum, ...) once, when it is first imported: imported without the switch, those stay GPU functions,
    and every interpreted kernel that calls one fails with "Cannot call @triton.jit'd outside of the scope
    of a kernel". Packages that import triton on their own (peft, torch._inductor) can do that first."""
    if not interpreter_enabled():
        return
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    if isinstance(tl.zeros, JITFunction):
        raise RuntimeError(
            "TRITON_INTERPRET=1 was set after `triton` was imported: triton's own @triton.jit functions "
            "(tl.zeros, tl.sum, ...) were made for the GPU and the interpreter cannot call them. Set "
            "TRITON_INTERPRET=1 before anything imports triton (peft and torch._inductor import it)"
        )


def _as_f32(data: np.ndarray, dtype) -> np.ndarray:
    import triton.language as tl

    if dtype == tl.bfloat16:
        return (data.astype(np.uint32) << 16).view(np.float32)
    return data.astype(np.float32)


def _f32_to_bf16_bits(data: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32))
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def patch_interpreter() -> None:
    """Install the fixed-order dot and round-to-nearest-even bf16 casts (idempotent)."""
    global _PATCHED
    check_triton_interprets()
    if _PATCHED:
        return
    import triton.language as tl
    from triton.runtime import interpreter as interp

    builder_cls = interp.InterpreterBuilder
    handle = interp.TensorHandle

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a32 = _as_f32(a.data, a.dtype.scalar)
        b32 = _as_f32(b.data, b.dtype.scalar)
        acc = _as_f32(d.data, d.dtype.scalar).copy()
        for kk in range(a32.shape[-1]):
            acc += a32[..., :, kk : kk + 1] * b32[..., kk : kk + 1, :]
        if d.dtype.scalar == tl.bfloat16:
            return handle(_f32_to_bf16_bits(acc), d.dtype.scalar)
        return handle(acc.astype(d.data.dtype), d.dtype.scalar)

    original_cast = builder_cls.cast_impl
    original_fp_to_fp = builder_cls.create_fp_to_fp

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return handle(_f32_to_bf16_bits(src.data), dst_type.scalar)
        return original_cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return handle(_f32_to_bf16_bits(src.data), dst_type.scalar)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    builder_cls.create_dot = create_dot
    builder_cls.cast_impl = cast_impl
    builder_cls.create_fp_to_fp = create_fp_to_fp
    _patch_language_once_per_launch(interp)
    _PATCHED = True


class _NothingToRestore:
    def restore(self) -> None:
        pass


def _patch_language_once_per_launch(interp) -> None:
    """Speed only: the interpreter re-patches triton.language (inspect.getmembers over its modules, about
    10 ms) at every call of a @triton.jit device function, tl.sum and tl.cumsum included: over half the time
    of a delta-rule chunk's forward substitution (two tl.sum a row). Nothing restores those patches before
    the launch ends (a device call's patch scope is dropped), so within a launch every call after a
    function's first finds them in place: those repeats are skipped. The launch's own patch (the kernel's,
    restored when the launch ends) is the first of its launch, and always made."""
    original = interp._patch_lang
    launch = interp.GridExecutor.__call__
    seen: set = set()

    def patch_lang(fn):
        if fn in seen:
            return _NothingToRestore()
        seen.add(fn)
        return original(fn)

    def run_launch(self, *args, **kwargs):
        seen.clear()
        try:
            return launch(self, *args, **kwargs)
        finally:
            seen.clear()

    interp._patch_lang = patch_lang
    interp.GridExecutor.__call__ = run_launch
