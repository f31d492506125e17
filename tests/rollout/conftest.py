"""Tiny models run many small torch ops: one intra-op thread avoids OpenMP barrier stalls when the cores
are shared (2-core CI, parallel jobs), which otherwise make these tests several times slower."""

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):  # tests/conftest.py
    yield
