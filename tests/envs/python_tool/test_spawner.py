"""The spawner thread: one per process, long-lived, and transparent for results and errors."""

import os
import threading

import pytest

from rz_agents.envs.python_tool.spawner import on_spawner, spawner_thread


def test_every_call_runs_on_the_same_long_lived_thread_whoever_calls():
    seen = []
    threads = [
        threading.Thread(target=lambda: seen.append(on_spawner(threading.current_thread))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen.append(on_spawner(threading.current_thread))
    assert {id(t) for t in seen} == {id(spawner_thread())}
    assert spawner_thread() is not threading.current_thread()
    assert spawner_thread().is_alive()


def test_results_and_exceptions_reach_the_caller():
    assert on_spawner(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(ZeroDivisionError):
        on_spawner(lambda: 1 / 0)
    assert on_spawner(lambda: on_spawner(lambda: 7)) == 7  # a nested call runs in place


def test_a_forked_child_gets_a_spawner_of_its_own():
    on_spawner(int)  # the parent's thread exists
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the parent's spawner thread was not copied by fork
        try:
            ok = on_spawner(lambda: threading.current_thread().name) == "rz-spawner"
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    os.close(read)
