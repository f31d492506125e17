"""Fixtures for the python_tool tests."""

import pytest
from sandbox_test_support import FAST

from rz_agents.envs.python_tool import PythonSandbox


@pytest.fixture
def sandbox():
    """A sandbox with small limits, so hostile programs fail fast."""
    with PythonSandbox(FAST) as sb:
        yield sb
