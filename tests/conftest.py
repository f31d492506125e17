"""Fixtures shared by several test folders."""

import pytest
import torch


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for the test: tiny models run many small torch ops, and OpenMP barrier stalls
    on shared cores (2-core CI, parallel jobs) otherwise make such tests several times slower. Folders of
    such tests use it for every test (their conftest.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
