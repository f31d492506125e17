"""Record every Triton launch a piece of code makes, without a GPU and without running a kernel.

Inside ``record_launches()``:

- ``JITFunction.run`` (what ``kernel[grid](...)`` calls) is replaced by a recorder: it binds the
  arguments with Triton's own binder for a CUDA backend, so the signature, the constexprs and the
  specialization of integers (== 1, divisible by 16) and pointers (16-byte aligned) are exactly what a
  launch on the GPU would compile; it evaluates the grid, stores one ``Launch`` and returns without
  running anything (outputs stay as allocated).
- Tensors are expected on the ``meta`` device (shapes, dtypes and strides, no data). A pointer's
  alignment is that of its storage offset (CUDA allocations start 256-byte aligned). Host-side index
  tensors (sequence ids, positions, plan tables) may stay real CPU tensors: an op that mixes them with
  meta tensors sees them moved to meta (``_MetaMixing``), so data-dependent planning (torch.unique of
  tiles) runs on real values while the activations cost nothing.
- The op set selection and the two ``is_cuda`` checks of ``rz_kernels.logprobs`` see meta as CUDA, so
  the Triton op set and the Triton log-softmax are what runs (the code paths a CUDA device takes).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# CUDA allocations are 256-byte aligned: a tensor's pointer alignment is set by its storage offset.
BASE_ALIGNMENT = 256

_local = threading.local()


@dataclass
class Launch:
    """One recorded launch: what Triton would compile (signature, constexprs, attrs, options) and its grid."""

    kernel: str  # module.qualname of the @triton.jit function
    signature: dict[str, str]  # argument -> "*bf16" | "i32" | "fp32" | "constexpr" ...
    constexprs: dict[str, Any]  # constexpr argument -> value (tl dtypes as their names)
    attrs: dict[str, list]  # argument -> [["tt.divisibility", 16]] (pointer alignment / int divisibility)
    num_warps: int
    num_stages: int
    grid: tuple[int, int, int]
    source: str = ""  # the kernel's JIT cache key (its source and its callees'): a cache entry's validity
    tags: dict[str, Any] = field(default_factory=dict)  # workload labels (model, side, phase, rows ...)
    args: dict[str, Any] = field(default_factory=dict)  # int/float values and tensor shapes, for cost models

    def key(self) -> str:
        """What distinguishes one binary from another (the grid and tags do not); computed once."""
        cached = self.__dict__.get("_key")
        if cached is None:
            fields = [self.kernel, self.source, self.signature, self.constexprs, self.attrs, self.num_warps,
                      self.num_stages]  # fmt: skip
            cached = self.__dict__["_key"] = json.dumps(fields, sort_keys=True)
        return cached

    def to_json(self) -> dict:
        return {
            "kernel": self.kernel,
            "signature": self.signature,
            "constexprs": self.constexprs,
            "attrs": self.attrs,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "grid": list(self.grid),
            "source": self.source,
            "tags": self.tags,
            "args": self.args,
        }

    @staticmethod
    def from_json(d: dict) -> Launch:
        return Launch(
            d["kernel"], d["signature"], d["constexprs"], d["attrs"], d["num_warps"], d["num_stages"],
            tuple(d["grid"]), d.get("source", ""), d.get("tags", {}), d.get("args", {}),
        )  # fmt: skip


class _PointerStandIn:
    """What Triton's binder reads of a tensor argument: its dtype and an address with its alignment."""

    def __init__(self, t: torch.Tensor) -> None:
        self.dtype = t.dtype
        self._ptr = BASE_ALIGNMENT * 64 + t.storage_offset() * t.element_size()

    def data_ptr(self) -> int:
        return self._ptr


def _constexpr_value(v: Any) -> Any:
    import triton.language as tl

    if isinstance(v, tl.dtype):
        return {"tl_dtype": v.name}
    if isinstance(v, tl.constexpr):
        return _constexpr_value(v.value)
    return v


class _MetaMixing(TorchDispatchMode):
    """Ops that mix meta tensors with real ones run on meta (the real ones moved there)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, spec = torch.utils._pytree.tree_flatten((args, kwargs))
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        if any(t.device.type == "meta" for t in tensors) and any(
            t.device.type != "meta" and t.dim() > 0 for t in tensors
        ):
            flat = [a.to("meta") if isinstance(a, torch.Tensor) and a.dim() > 0 else a for a in flat]
            args, kwargs = torch.utils._pytree.tree_unflatten(flat, spec)
        return func(*args, **kwargs)


class LaunchRecorder:
    """Collects ``Launch``es; ``tags`` (set with ``tagged``) label the ones recorded meanwhile."""

    def __init__(self) -> None:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend

        self.launches: list[Launch] = []
        self.tags: dict[str, Any] = {}
        self.backend = make_backend(GPUTarget("cuda", 90, 32))
        self._binders: dict[int, Any] = {}

    @contextlib.contextmanager
    def tagged(self, **tags: Any) -> Iterator[None]:
        old = self.tags
        self.tags = {**old, **tags}
        try:
            yield
        finally:
            self.tags = old

    def record(self, fn, args, grid, kwargs) -> None:
        from triton import knobs
        from triton.runtime.jit import create_function_from_signature

        binder = self._binders.get(id(fn))
        if binder is None:
            binder = create_function_from_signature(fn.signature, fn.params, self.backend)
            self._binders[id(fn)] = binder
        kwargs = dict(kwargs)
        kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        stand = [_PointerStandIn(a) if isinstance(a, torch.Tensor) else a for a in args]
        bound, specialization, options = binder(*stand, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(
            self.backend, kwargs, bound, specialization, options
        )
        names = [p.name for p in fn.params]
        if callable(grid):
            grid = grid(bound)
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        values: dict[str, Any] = {}
        for name, a in zip(names, args, strict=False):
            if isinstance(a, torch.Tensor):
                values[name] = {"shape": list(a.shape), "dtype": str(a.dtype).replace("torch.", "")}
            elif isinstance(a, (int, float)) and not isinstance(a, bool):
                values[name] = a
        for name, a in kwargs.items():
            if isinstance(a, (int, float)) and not isinstance(a, bool) and name in names:
                values[name] = a
        self.launches.append(
            Launch(
                kernel=f"{fn.fn.__module__}.{fn.fn.__qualname__}",
                signature=dict(signature),
                constexprs={names[k[0]]: _constexpr_value(v) for k, v in constexprs.items()},
                attrs={names[k[0]]: [list(x) for x in v] for k, v in attrs.items()},
                num_warps=options.num_warps,
                num_stages=options.num_stages,
                grid=grid,
                source=fn.cache_key,
                # launches the autograd engine makes (backward, and checkpointed forwards recomputed there)
                tags={**self.tags, "in_backward": torch._C._current_graph_task_id() != -1},
                args=values,
            )
        )


def _recording_run(self, *args, grid, warmup, **kwargs):
    recorder = getattr(_local, "recorder", None)
    if recorder is None:
        raise RuntimeError("a Triton launch outside record_launches() while the recorder is installed")
    recorder.record(self, args, grid, kwargs)
    return None


@contextlib.contextmanager
def record_launches() -> Iterator[LaunchRecorder]:
    """Record (and skip) every Triton launch made inside; meta tensors stand for CUDA tensors."""
    import triton.runtime.jit as jit

    import rz_kernels.opset as opset_module
    from rz_kernels.triton_ops.opset import TRITON

    if getattr(_local, "recorder", None) is not None:
        raise RuntimeError("record_launches() is already active in this thread")
    recorder = LaunchRecorder()
    saved_run = jit.JITFunction.run
    saved_opset = opset_module._triton_opset
    saved_is_cuda = torch.Tensor.__dict__.get("is_cuda")
    base_is_cuda = torch._C.TensorBase.is_cuda
    _local.recorder = recorder
    jit.JITFunction.run = _recording_run
    opset_module._triton_opset = lambda: TRITON
    # The CUDA-only branches of rz_kernels.logprobs (Triton log-softmax) must see meta as CUDA.
    torch.Tensor.is_cuda = property(lambda t: t.device.type == "meta" or base_is_cuda.__get__(t))
    try:
        with _MetaMixing():
            yield recorder
    finally:
        _local.recorder = None
        jit.JITFunction.run = saved_run
        opset_module._triton_opset = saved_opset
        if saved_is_cuda is None:
            del torch.Tensor.is_cuda
        else:
            torch.Tensor.is_cuda = saved_is_cuda
