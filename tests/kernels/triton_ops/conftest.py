"""The Triton op set runs here on CPU through the Triton interpreter (no GPU in CI).

TRITON_INTERPRET must be set before `triton` is first imported (`@triton.jit` reads it, and triton jits its
own library on import): tests/conftest.py sets it when the session starts, for any session that collects
this folder (set here it could come after another test module imported triton; patch_interpreter then
stops with a clear error). The interpreter's dot and bf16 casts are replaced by GPU-faithful ones
(rz_kernels.triton_ops.interpreter). Shapes stay tiny: the interpreter runs every program of a launch in
Python.
"""

import importlib.util
import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"  # (already set by tests/conftest.py)

if importlib.util.find_spec("triton") is not None:
    from rz_kernels.triton_ops.interpreter import patch_interpreter

    patch_interpreter()


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):  # tests/conftest.py
    yield
