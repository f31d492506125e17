"""The Ray resource preflight (issue 54): a run whose actors the cluster cannot all place is refused in one
line naming the shortfall (GPUs, CPUs, custom resources, GPU memory) instead of Ray queueing the actors
that do not fit forever. Before: RayRun placed the learner ranks of the 16-GPU recipe on an 8-GPU cluster
and its engine replicas waited with no message."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rz_agents.cli.train import load_run_config
from rz_agents.runtime.ray.preflight import ClusterTooSmall, actor_demands, placement_shortfall, preflight

REPO = Path(__file__).resolve().parents[2]
RECIPE_16 = REPO / "configs" / "qwen3-4b-python-tool.yaml"
RECIPE_8XH100 = REPO / "configs" / "qwen3-4b-python-tool-8xh100.yaml"


def _node(gpus: float, cpus: float, **resources: float) -> dict[str, float]:
    return {"GPU": gpus, "CPU": cpus, **resources}


def test_the_16_gpu_recipe_on_8_gpus_is_refused_naming_the_gpus():
    actors = load_run_config(str(RECIPE_16)).actors
    short = placement_shortfall(actor_demands(actors), [_node(8, 256)])
    assert short == "needs 16 GPU (8 engine replicas x 1 + 8 learner ranks x 1), the cluster has 8"
    assert placement_shortfall(actor_demands(actors), [_node(8, 128), _node(8, 128)]) is None


def test_enough_in_all_but_not_on_one_node_is_refused():
    actors = load_run_config(str(RECIPE_8XH100)).actors
    # 8 GPUs and 120 CPUs in all, but the GPU node has 8 CPUs: its learner ranks (4 CPUs each) do not fit
    short = placement_shortfall(actor_demands(actors), [_node(8, 8), _node(0, 112)])
    assert short is not None and "fits on no node" in short and "GPU" in short
    assert placement_shortfall(actor_demands(actors), [_node(8, 96)]) is None


def test_custom_resources_and_gpu_memory_are_compared():
    cfg = load_run_config(str(RECIPE_16))
    demands = actor_demands(cfg.actors)
    pinned = [d.__class__(d.kind, d.count, d.cpus, d.gpus, {"rollout_node": 1}) for d in demands]
    assert "rollout_node" in placement_shortfall(pinned, [_node(16, 256)])
    big = [d.__class__(d.kind, d.count, d.cpus, d.gpus, {}, 117 * 2**30) for d in demands]
    h100s = [_node(8, 128, **{"accelerator_type:H100": 1}), _node(8, 128, **{"accelerator_type:H100": 1})]
    assert "needs 117.0 GiB" in placement_shortfall(big, h100s) and "H100" in placement_shortfall(big, h100s)
    h200s = [{**n, "accelerator_type:H200": 1} for n in (_node(8, 128), _node(8, 128))]
    assert placement_shortfall(big, h200s) is None


def test_the_refusal_is_one_line_and_can_be_skipped_for_an_autoscaling_cluster(monkeypatch):
    actors = load_run_config(str(RECIPE_16)).actors
    with pytest.raises(ClusterTooSmall) as err:
        preflight(actors, nodes=[_node(8, 256)])
    assert "\n" not in str(err.value) and "needs 16 GPU" in str(err.value)
    monkeypatch.setenv("RZ_SKIP_RAY_PREFLIGHT", "1")
    preflight(actors, nodes=[_node(8, 256)])


_ON_A_FAKE_GPU_CLUSTER = """
import ray
from rz_agents.cli.train import load_run_config
from rz_agents.runtime.ray.preflight import ClusterTooSmall, preflight, run_estimate
from rz_agents.runtime.ray.run import RayRun
# a CPU Ray instance announcing 8 GPUs of type H100 (Ray takes num_gpus as given: no GPU is touched)
ray.init(address="local", num_cpus=96, num_gpus=8, resources={"accelerator_type:H100": 1},
         include_dashboard=False, logging_level="WARNING")
try:
    RayRun(load_run_config(%(recipe16)r))  # connects to the instance above, places nothing
    print("PLACED 16-GPU RECIPE")
except ClusterTooSmall as exc:
    print("REFUSED:", exc)
cfg = load_run_config(%(recipe8)r)
preflight(cfg.actors, run_estimate(cfg))
print("8xH100 RECIPE FITS")
"""


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")
def test_a_cpu_ray_cluster_with_8_fake_gpus_refuses_the_16_gpu_recipe_and_takes_the_8_gpu_one():
    code = _ON_A_FAKE_GPU_CLUSTER % {"recipe16": str(RECIPE_16), "recipe8": str(RECIPE_8XH100)}
    env = {**os.environ, "RAY_memory_monitor_refresh_ms": "0"}
    env.pop("RZ_SKIP_RAY_PREFLIGHT", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    refused = [line for line in proc.stdout.splitlines() if line.startswith("REFUSED:")]
    assert len(refused) == 1, proc.stdout
    assert "needs 16 GPU (8 engine replicas x 1 + 8 learner ranks x 1), the cluster has 8" in refused[0]
    assert "8xH100 RECIPE FITS" in proc.stdout


def test_a_cluster_that_one_order_of_placement_fills_wrongly_is_not_refused():
    from rz_agents.runtime.ray.preflight import ActorDemand

    # pinned learner ranks need the small node; unpinned env workers placed first would take its CPUs
    demands = [
        ActorDemand("env worker", 2, 4, 0.0),
        ActorDemand("learner rank", 1, 4, 1.0, {"learner_node": 0.01}),
    ]
    nodes = [_node(1, 4, learner_node=1), _node(0, 8)]  # first fit in the given order: an env worker first
    assert placement_shortfall(demands, nodes) is None
    assert "fits on no node" in placement_shortfall(demands, [_node(1, 2, learner_node=1), _node(0, 12)])
