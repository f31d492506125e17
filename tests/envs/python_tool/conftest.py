"""Fixtures for the python_tool tests: the hostile-program tests run against every usable backend."""

import pytest
from sandbox_test_support import FAST, docker_problem

from rz_agents.envs.python_tool import PythonSandbox


@pytest.fixture(params=["local", "docker"])
def backend(request) -> str:
    """Each sandbox backend; docker is skipped (with the reason) where no engine or image is there."""
    if request.param == "docker":
        problem = docker_problem()
        if problem:
            pytest.skip(problem)
    return request.param


@pytest.fixture
def sandbox(backend):
    """A sandbox with small limits, so hostile programs fail fast."""
    with PythonSandbox(FAST, backend=backend) as sb:
        yield sb
