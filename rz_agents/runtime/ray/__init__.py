"""The Ray runtime (``runtime: ray``): engine replicas, env workers and FSDP2 learner ranks as Ray actors,
driven by the same controller and training loop as the local runtime. Needs
``pip install 'rz-agents[ray]'``."""

from rz_agents.runtime.ray.run import RayRun

__all__ = ["RayRun"]
