"""Model code shared by engine and trainer: config, transformer, KV cache, log-probs."""

from rz_agents.model.config import ModelConfig
from rz_agents.model.kv_cache import KVCache
from rz_agents.model.transformer import Transformer

__all__ = ["KVCache", "ModelConfig", "Transformer"]
