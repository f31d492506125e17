"""Fixtures shared by several test folders, and the Triton interpreter switch of a session."""

import os
from pathlib import Path

import pytest
import torch

TRITON_TESTS = Path(__file__).resolve().parent / "kernels" / "triton_ops"


def pytest_configure(config):
    """A session that collects tests/kernels/triton_ops runs Triton in its interpreter: TRITON_INTERPRET=1,
    set here, before any test module is imported. triton reads it once, when it is first imported (its own
    library, tl.zeros / tl.sum, is @triton.jit'd then), and a module collected before that folder's conftest
    may import triton (peft does): set there, the switch would come too late for such a session."""
    here = Path(config.invocation_params.dir)
    for arg in config.args:
        path = (here / arg.split("::")[0]).resolve()
        if path == TRITON_TESTS or TRITON_TESTS in path.parents or path in TRITON_TESTS.parents:
            os.environ["TRITON_INTERPRET"] = "1"
            return


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for the test: tiny models run many small torch ops, and OpenMP barrier stalls
    on shared cores (2-core CI, parallel jobs) otherwise make such tests several times slower. Folders of
    such tests use it for every test (their conftest.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
