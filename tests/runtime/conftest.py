"""One Ray instance for the whole test session: a two-node cluster simulated on this machine (two raylets,
two object stores), so every Ray test also moves objects between nodes. The head node carries the custom
resource ``rollout_node``, the second node ``learner_node``: an actors: section asking for them pins actors to
one node or the other. Small on purpose (the machine has 2 cores): 100 MB object store per node."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    # Ray kills workers when the machine's memory is 95% used, whoever uses it: on a shared CI machine that
    # is other jobs' memory, and the tests would fail for it. (Runs keep Ray's default.)
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "0")
    monkeypatch.setenv("RAY_worker_niceness", "0")  # as a run's local instance (RayConfig.worker_niceness)
    store = 100 * 2**20
    # Logical CPUs: enough for every actor of a test's run; the actors' torch threads are set by the runs.
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 8,
            "resources": {"rollout_node": 100},
            "object_store_memory": store,
            "include_dashboard": False,
        },
    )
    cluster.add_node(num_cpus=4, resources={"learner_node": 100}, object_store_memory=store)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        monkeypatch.undo()


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):  # tests/conftest.py
    yield
