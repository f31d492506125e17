"""A dense model's predicted decode step from its recorded launches (gpu_check prints it beside measured)."""

from __future__ import annotations

import dataclasses
from typing import Any

from rz_agents.compile_check.workloads import RecipeShapes, record_recipe
from rz_agents.model.config import ModelConfig
from rz_kernels.compile_check.cost_model import HBM_BYTES_PER_S, decode_roofline_bytes, step_prediction


def predict_decode_step(model_cfg: ModelConfig, batch: int, context: int) -> dict[str, Any]:
    """The static cost model's decode step of ``batch`` rows at ``context`` positions on an H200: the
    launches the engine's decode step makes (recorded on meta tensors, no GPU), their predicted time, and
    the HBM roofline. Returns step_ms, tokens_per_s, roofline_ms, fraction_of_roofline, by_kernel."""
    if batch < 1 or context < 1:
        raise ValueError(f"predict_decode_step: batch and context must be >= 1, got {batch}, {context}")
    shapes = RecipeShapes(
        name="predict", model=model_cfg, max_running=batch, max_len=context + 1,
        max_batch_tokens=max(batch, 8), micro_batch_tokens=2, activation_checkpointing=False,
    )  # fmt: skip
    launches = record_recipe(shapes, buckets=[batch], contexts=(context,), train=False, prefill=False)
    decode = [x for x in launches if x.tags.get("phase") == "decode"]
    pred = step_prediction(decode)
    out = {"batch": batch, "context": context, "step_ms": pred["seconds"] * 1e3,
           "tokens_per_s": batch / pred["seconds"], "launches": pred["launches"],
           "by_kernel": pred["by_kernel"]}  # fmt: skip
    if not model_cfg.num_experts:
        roof = decode_roofline_bytes(dataclasses.asdict(model_cfg), batch, context) / HBM_BYTES_PER_S
        out.update(roofline_ms=roof * 1e3, fraction_of_roofline=roof / pred["seconds"])
    return out
