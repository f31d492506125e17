"""Record the ops that read a device value back to the host (a host sync on a GPU), on any device.

Under ``HostReads()`` every aten op that needs a device value on the host is recorded with where it
was called from: ``item`` / ``int`` / ``float`` / ``bool`` of a tensor (_local_scalar_dense or item),
nonzero, unique*, masked_select, bincount, equal, an index by a bool mask, a repeat_interleave by a
tensor of repeats without output_size; ``Tensor.tolist`` and ``Tensor.numpy`` (which bypass the
dispatcher) are patched for the duration. On CPU nothing stalls, but the same code on CUDA would
sync at each record, so a CPU test can prove a step sync-free. (A copy to the host from a CUDA
tensor is not visible on CPU: ``torch.cuda.set_sync_debug_mode("error")`` covers that on a GPU.)
Reads inside a Triton kernel that the Triton interpreter runs are not recorded: on a GPU they are
device code. The dispatch mode is per thread; the patched methods count only the entering thread.
"""

from __future__ import annotations

import threading
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

READ_OPS = {
    "_local_scalar_dense",
    "item",
    "is_nonzero",
    "equal",
    "nonzero",
    "unique_consecutive",
    "_unique",
    "_unique2",
    "unique_dim",
    "masked_select",
    "bincount",
    "histc",
}


def _where() -> str | None:
    """The last three frames of our code that led here (innermost first); None inside a Triton kernel run
    by the Triton interpreter (its emulation of device code, not a host read of the program)."""
    stack = traceback.extract_stack()
    if any(
        "triton/runtime/interpreter" in f.filename or "triton_ops/interpreter" in f.filename for f in stack
    ):
        return None
    frames = [
        f
        for f in stack
        if ("/rz_agents/" in f.filename or "/rz_kernels/" in f.filename) and f.filename != __file__
    ]
    return " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in reversed(frames[-3:]))


class HostReads(TorchDispatchMode):
    """Records (op, where) of every op that reads a device value back to the host in ``reads``."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        bool_index = name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
            for i in (args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else [])
        )
        repeats = None
        if name == "repeat_interleave":  # by a tensor of repeats, with no output_size: a read of their sum
            repeats = args[0] if func._overloadname == "Tensor" else (args[1:2] or [kwargs.get("repeats")])[0]
        by_tensor = isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
        if name in READ_OPS or bool_index or by_tensor:
            self._record(name)
        return func(*args, **kwargs)

    def _record(self, name: str) -> None:
        where = _where()
        if where is not None:
            self.reads.append((name, where))

    def __enter__(self):
        self._tolist, self._numpy = torch.Tensor.tolist, torch.Tensor.numpy
        tolist, numpy, thread = self._tolist, self._numpy, threading.get_ident()

        def record(name: str) -> None:  # the patch is process-wide: count this thread's calls only
            if threading.get_ident() == thread:
                self._record(name)

        torch.Tensor.tolist = lambda t: record("tolist") or tolist(t)
        torch.Tensor.numpy = lambda t, **kw: record("numpy") or numpy(t, **kw)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist, torch.Tensor.numpy = self._tolist, self._numpy
        return super().__exit__(*exc)
