"""Factories shared by every runtime: the policy model, tokenizer + chat template, and env constructors."""

from __future__ import annotations

import importlib

import torch

from rz_agents.envs.registry import is_class_path
from rz_agents.model.packaged import resolve_checkpoint
from rz_agents.runtime.config import EnvSpec, ModelSpec
from rz_agents.runtime.device import resolve_device


def build_model(spec: ModelSpec, vocab_size: int):
    """The policy model (random tiny, or loaded from an HF checkpoint) on ``spec.device``.

    Raises DeviceError (a ValueError) when the device is absent on this machine."""
    from rz_agents.model import ModelConfig, Transformer

    device = resolve_device(spec.device, "model.device")
    kernels = spec.kernels or "aligned"  # a resolved run config names them; a bare spec means aligned
    if spec.checkpoint:
        from rz_agents.model.checkpoint import load_hf_checkpoint

        model = load_hf_checkpoint(
            resolve_checkpoint(spec.checkpoint), kernels=kernels, dtype=spec.dtype, device=device
        )
        model.config.activation_checkpointing = spec.activation_checkpointing
        return model
    overrides = {
        "vocab_size": vocab_size,
        "dtype": spec.dtype,
        "activation_checkpointing": spec.activation_checkpointing,
        **spec.tiny_overrides,
    }
    torch.manual_seed(spec.init_seed)
    model = Transformer(ModelConfig.tiny(spec.model_type, **overrides), kernels=kernels)
    model.reset_parameters(seed=spec.init_seed)
    return model.to(device)


def build_tokenizer(name: str, checkpoint: str | None = None):
    """(tokenizer, chat template) for the run."""
    if name == "byte":
        from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer

        return ByteTokenizer(), ByteChatTemplate()
    if name == "checkpoint":
        from rz_agents.model.chat_template import template_for
        from rz_agents.model.tokenizer import Tokenizer

        directory = resolve_checkpoint(checkpoint or "")
        if not (directory / "tokenizer.json").is_file():
            raise FileNotFoundError(f"tokenizer: checkpoint, but {directory} has no tokenizer.json")
        tokenizer = Tokenizer.from_dir(directory)
        return tokenizer, template_for(tokenizer)
    from rz_agents.model.chat_template import ChatTemplate
    from rz_agents.model.tokenizer import qwen3_tokenizer

    return qwen3_tokenizer(), ChatTemplate()


def env_factory(spec: EnvSpec):
    """A zero-argument callable building one env instance."""
    if is_class_path(spec.id):
        module, _, name = spec.id.partition(":")
        cls = getattr(importlib.import_module(module), name)
        return lambda: cls(**spec.kwargs)
    import gymnasium

    # Gymnasium wrappers (order enforcing, passive checker) reject text spaces: take the env itself.
    return lambda: gymnasium.make(spec.id, disable_env_checker=True, **spec.kwargs).unwrapped
