"""Tiny models run many small torch ops: one intra-op thread avoids OpenMP barrier stalls when the cores
are shared (2-core CI, parallel jobs), which otherwise make these tests several times slower."""

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):  # tests/conftest.py
    yield


@pytest.fixture(scope="session")
def spawn_ranks():
    """``run(target, *args, world=2)``: ``target(rank, world, *args)`` in ``world`` spawned processes (the
    ranks of one gloo group, which ``target`` joins); fails naming the exit codes unless every rank exits 0
    within ``timeout`` seconds."""
    import torch.multiprocessing as mp

    def run(target, *args, world: int = 2, timeout: float = 300) -> None:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=target, args=(rank, world, *args)) for rank in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=timeout)
        codes = [p.exitcode for p in procs]
        for p in procs:
            if p.is_alive():
                p.kill()
        assert codes == [0] * world, f"learner ranks exited with {codes}"

    return run
