"""Inference engine: token-in/token-out generation with continuous batching and aligned log-probs.

engine = RZEngine(Transformer(cfg, kernels="aligned"), EngineConfig(max_running=16))
completion = await engine.generate(prompt_tokens, SamplingParams(temperature=1.0, max_tokens=64))
engine.load_weights(state_dict, version=1)
"""

from rz_agents.engine.batch import generate_batch
from rz_agents.engine.config import EngineConfig
from rz_agents.engine.engine import RZEngine
from rz_agents.engine.images import ImagePrompt
from rz_agents.engine.params import Completion, SamplingParams
from rz_agents.engine.protocol import Engine

__all__ = [
    "Completion",
    "Engine",
    "EngineConfig",
    "ImagePrompt",
    "RZEngine",
    "SamplingParams",
    "generate_batch",
]
