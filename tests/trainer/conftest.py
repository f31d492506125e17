"""Tiny models run many small torch ops: one intra-op thread avoids OpenMP barrier stalls when the cores
are shared (2-core CI, parallel jobs), which otherwise make these tests several times slower."""

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):  # tests/conftest.py
    yield


# What a rank imports before its target runs. The ranks fork from one server process that imported these once
# per session (multiprocessing's forkserver): a spawned rank imported them itself, every call, ~4 CPU-s per
# rank for torch and rz_agents and ~10 more for the vision-language image processor (transformers).
RANK_PRELOAD = [
    "torch",
    "torch.distributed.fsdp",
    "rz_agents.engine",
    "rz_agents.trainer.learner",
    "rz_agents.trainer.sharding",
    "rz_agents.model.vl_processor",
    "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl",
]


@pytest.fixture(scope="session")
def spawn_ranks():
    """``run(target, *args, world=2)``: ``target(rank, world, *args)`` in ``world`` new processes (the ranks
    of one gloo group, which ``target`` joins), forked from a server that preloaded ``RANK_PRELOAD`` (a
    clean process: no torch op has run there, so no OpenMP pool is forked); fails naming the exit codes
    unless every rank exits 0 within ``timeout`` seconds."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(RANK_PRELOAD)

    def run(target, *args, world: int = 2, timeout: float = 600) -> None:
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
