"""Tiny models run many small torch ops: one intra-op thread avoids OpenMP barrier stalls when the cores
are shared (2-core CI, parallel jobs), which otherwise make these tests several times slower."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
