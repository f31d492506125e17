"""Factories shared by every runtime: the policy model, tokenizer + chat template, env constructors and the
rollout controller."""

from __future__ import annotations

import importlib

import torch

from rz_agents.envs.registry import is_class_path
from rz_agents.model.packaged import resolve_checkpoint
from rz_agents.rollout.controller import RolloutController
from rz_agents.rollout.task_source import TaskSource
from rz_agents.runtime.config import EnvSpec, ModelSpec, TrainConfig
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


def vocab_size(tokenizer_name: str, tokenizer) -> int:
    """The model's vocabulary size for the run's tokenizer (the byte tokenizer's tiny vocab is padded)."""
    return max(int(tokenizer.vocab_size), 320) if tokenizer_name == "byte" else len(tokenizer)


def tokenizer_files(tokenizer_name: str, checkpoint: str | None) -> dict[str, str]:
    """The source checkpoint's tokenizer files, exported with the model when the run uses its tokenizer."""
    extra: dict[str, str] = {}
    if tokenizer_name == "checkpoint":
        source = resolve_checkpoint(checkpoint or "")
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if (source / name).is_file():
                extra[name] = (source / name).read_text()
    return extra


def build_controller(cfg: TrainConfig, engine, make_env, template, tokenizer) -> RolloutController:
    """The rollout controller of a resolved run config (``resolve``: the lag bound in force, the run's seed)
    over ``engine`` (an engine, or the Ray runtime's replica router) and ``make_env`` (an env factory: local
    envs, or handles on envs in Ray env workers)."""
    return RolloutController(
        engine, make_env, template, tokenizer, TaskSource(cfg.env.tasks, seed=cfg.seed), cfg.rollout
    )
