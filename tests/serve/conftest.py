"""One torch thread for every rz serve test (tiny models, shared cores); the helpers are serve_fixtures.py
(a module of its own name: a second conftest module could not be imported by name beside
tests/*/conftest.py)."""

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):  # tests/conftest.py
    yield
