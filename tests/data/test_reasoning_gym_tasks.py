"""Optional reasoning-gym tasks in our task format."""

import pytest

from rz_agents.data import reasoning_gym_tasks

pytest.importorskip("reasoning_gym")


def test_tasks_are_deterministic_and_in_our_format():
    a = reasoning_gym_tasks("basic_arithmetic", 5, seed=1)
    assert a == reasoning_gym_tasks("basic_arithmetic", 5, seed=1)
    assert [set(t) for t in a] == [{"id", "question", "answer"}] * 5
    assert a[0]["id"] == "rg-basic_arithmetic-s1-0" and a[0]["answer"].lstrip("-").isdigit()


def test_unknown_generator_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot build 'no_such_task'"):
        reasoning_gym_tasks("no_such_task", 1)
