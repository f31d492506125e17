"""Build the run a config asks for (``runtime: local | ray``) and train it."""

from __future__ import annotations

import asyncio
from typing import Any

from rz_agents.runtime.config import TrainConfig
from rz_agents.runtime.local import LocalRun
from rz_agents.runtime.plan import RunPlan


def build_run(cfg: TrainConfig, plan: RunPlan | None = None):
    """A ``LocalRun`` or a ``RayRun`` (rz_agents.runtime.ray, imported only then) for ``cfg``, built from
    ``plan`` (what ``cfg.validate()`` returned; None: validated and resolved here)."""
    if cfg.runtime == "ray":
        from rz_agents.runtime.ray import RayRun

        return RayRun(cfg, plan)
    return LocalRun(cfg, plan)


def run_training(cfg: TrainConfig) -> dict[str, Any]:
    """Build everything from ``cfg``, train ``cfg.steps`` steps, and return a summary."""
    run = build_run(cfg)
    try:
        return asyncio.run(run.train())
    finally:
        run.close()
