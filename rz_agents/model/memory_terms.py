"""Which module sizes a model's own memory terms for the estimate (runtime/memory_estimate.py): the hybrid
linear-attention families, whose layers and engine cache differ from a plain transformer's, each answer the
same functions (``layer_activation_bytes``, ``engine_step_width``, ``page_bytes``, ``engine_cache_terms``,
``cache_note``), so the estimate asks the model instead of knowing its family."""

from __future__ import annotations

from types import ModuleType

from rz_agents.model import kimi_linear_memory, qwen3_5_memory
from rz_agents.model.kimi_linear_config import KimiLinearConfig
from rz_agents.model.qwen3_5_config import Qwen35Config


def hybrid_memory_terms(config: object) -> ModuleType | None:
    """The memory-terms module of a hybrid model's config (Qwen3.5 dense or MoE, Kimi Linear); None for a
    config the estimate's own transformer formulas size."""
    if isinstance(config, Qwen35Config):
        return qwen3_5_memory
    if isinstance(config, KimiLinearConfig):
        return kimi_linear_memory
    return None
