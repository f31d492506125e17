"""The policy builder: the one place a policy model is made.

A ``PolicySpec`` says what the policy is: a family (a random tiny model of ``model_type``) or an HF
checkpoint, its op set and dtype, the LoRA adapters it holds (a saved adapter, a PEFT directory, the
learner's ``lora``) and its frozen parts (the vision tower). ``build_policy`` turns it into the model, in one
order: base weights, then adapters (attached once, then filled from their files), then freezing. Every
runtime, the engine replicas, the learner ranks, warm start, ``rz serve`` and eval build theirs here, so the
parts that hold the policy cannot disagree on its shape; the values of adapters a learner initialised travel
to its engines with the first weights (the engines never re-create them "with the same seed").
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rz_agents.model.freeze import freeze_vision_tower
from rz_agents.model.hf_files import load_hf_base, model_skeleton, saved_adapter
from rz_agents.model.kimi_linear_config import KimiLinearConfig
from rz_agents.model.lora import LoraConfig, add_lora, has_lora
from rz_agents.model.peft_files import load_peft_adapter, read_peft_config
from rz_agents.model.qwen3_5_config import MODEL_TYPES as QWEN3_5_TYPES
from rz_agents.model.qwen3_5_config import MOE_TYPES as QWEN3_5_MOE_TYPES
from rz_agents.model.qwen3_5_config import Qwen35Config
from rz_agents.model.qwen3_5_vl_config import Qwen35VLConfig


@dataclass
class PolicySpec:
    """What a policy model is. ``checkpoint`` (an HF directory, or a packaged model's name) decides the
    family and weights; without one the policy is a random tiny ``model_type`` model (``ModelConfig.tiny``
    with ``vocab_size``, ``dtype`` and ``tiny_overrides``), seeded with ``init_seed``."""

    checkpoint: str | os.PathLike | None = None
    model_type: str = "qwen3"
    vocab_size: int | None = None  # a tiny model's vocabulary (the tokenizer's); a checkpoint has its own
    tiny_overrides: dict[str, Any] = field(default_factory=dict)
    init_seed: int = 0
    kernels: str = "aligned"  # the op set of engine and learner alike
    dtype: str | None = None  # None: the checkpoint's own (float32 for a tiny model)
    activation_checkpointing: bool = False
    adapter: str | os.PathLike | None = None  # a PEFT LoRA directory loaded on top (base + adapter)
    lora: LoraConfig | None = None  # the adapters a learner trains (None or rank 0: none)
    freeze_vision: bool = False  # the vision tower does not train (a vision-language policy)
    # a model config (ModelConfig, Qwen3VLConfig, Qwen35Config) instead of a checkpoint: the policy's shapes
    # on the meta device, adapters included (the compile check's recipe shapes; the config's own
    # activation_checkpointing holds)
    config: Any = None


def build_policy(spec: PolicySpec, device: torch.device | str = "cpu") -> nn.Module:
    """The policy ``spec`` describes on ``device`` ("meta": shapes only, for learner ranks that shard it and
    then cut their shards from the checkpoint; no adapters then). Adapters come from, in order, the
    checkpoint's saved ``lora_adapter/``, ``spec.adapter`` and ``spec.lora``: the first attaches them, the
    others must have their shape (ValueError naming both otherwise); files fill their values. With
    adapters only they train; ``spec.freeze_vision`` stops the vision tower training."""
    if spec.config is not None:
        model = _of_config(spec, device)
    elif _is_deepseek_v4(spec):  # its own model class (model/deepseek_v4.py): no adapters yet
        return _deepseek_v4(spec, device)
    elif str(device) == "meta":
        model = _skeleton(spec)
    else:
        model = _base(spec, device)
        _attach_adapters(model, spec)
    if spec.freeze_vision:
        freeze_vision_tower(model)
    return model


def _of_config(spec: PolicySpec, device: torch.device | str) -> nn.Module:
    """The shapes of ``spec.config``'s model on the meta device (no weights), its adapters attached."""
    from rz_agents.model import Transformer
    from rz_agents.model.qwen3_5 import Qwen35ForCausalLM
    from rz_agents.model.qwen3_vl import Qwen3VLModel
    from rz_agents.model.qwen3_vl_config import Qwen3VLConfig

    if str(device) != "meta" or spec.checkpoint or spec.adapter:
        raise ValueError(
            "PolicySpec.config builds shapes only: on the meta device, with no checkpoint or adapter"
        )
    cfg = spec.config
    with torch.device("meta"):
        if isinstance(cfg, Qwen3VLConfig):
            model = Qwen3VLModel(cfg, kernels=spec.kernels, init=False)
        elif isinstance(cfg, Qwen35Config):
            model = Qwen35ForCausalLM(cfg, kernels=spec.kernels)
        elif isinstance(cfg, Qwen35VLConfig):
            from rz_agents.model.qwen3_5_vl import Qwen35VLForConditionalGeneration

            model = Qwen35VLForConditionalGeneration(cfg, kernels=spec.kernels)
        else:
            model = Transformer(cfg, kernels=spec.kernels, init=False)
        _attach_adapters(model, spec)  # (the config says itself whether activations are recomputed)
    return model


def _checkpoint_dir(spec: PolicySpec) -> Path:
    from rz_agents.model.packaged import PACKAGED_MODELS, resolve_checkpoint

    # a directory is read as is (its reader names what it lacks); a packaged model's name is resolved
    name = str(spec.checkpoint)
    return resolve_checkpoint(name) if name in PACKAGED_MODELS else Path(name)


def _is_deepseek_v4(spec: PolicySpec) -> bool:
    if not spec.checkpoint:
        return spec.model_type == "deepseek_v4"
    from rz_agents.model.deepseek_v4 import is_deepseek_v4

    return is_deepseek_v4(_checkpoint_dir(spec))


def _deepseek_v4(spec: PolicySpec, device: torch.device | str) -> nn.Module:
    """A DeepSeek-V4 policy: a checkpoint's weights or a seeded random tiny model (no adapters, no vision)."""
    from rz_agents.model.deepseek_v4 import DeepseekV4ForCausalLM, load_deepseek_v4
    from rz_agents.model.deepseek_v4_config import DeepseekV4Config

    if spec.adapter or (spec.lora is not None and spec.lora.enabled) or spec.freeze_vision:
        raise ValueError("deepseek_v4 policies take no LoRA adapters or vision freezing yet")
    if spec.checkpoint:
        directory = _checkpoint_dir(spec)
        if str(device) == "meta":
            with torch.device("meta"):
                model = DeepseekV4ForCausalLM(
                    DeepseekV4Config.from_checkpoint(directory, spec.dtype), spec.kernels, init=False
                )
        else:
            model = load_deepseek_v4(directory, kernels=spec.kernels, dtype=spec.dtype, device=device)
    else:
        if str(device) == "meta":
            raise ValueError(
                "build_policy on the meta device needs a checkpoint (its weights fill the shards)"
            )
        if spec.vocab_size is None:
            raise ValueError(
                "PolicySpec.vocab_size: a random tiny model needs its tokenizer's vocabulary size"
            )
        overrides = {"vocab_size": spec.vocab_size, "dtype": spec.dtype or "float32", **spec.tiny_overrides}
        torch.manual_seed(spec.init_seed)
        model = DeepseekV4ForCausalLM(DeepseekV4Config.tiny(**overrides), kernels=spec.kernels)
        model.reset_parameters(seed=spec.init_seed)
        model = model.to(device)
    model.config.activation_checkpointing = spec.activation_checkpointing
    return model


def _skeleton(spec: PolicySpec) -> nn.Module:
    if not spec.checkpoint:
        raise ValueError("build_policy on the meta device needs a checkpoint (its weights fill the shards)")
    if spec.adapter or (spec.lora is not None and spec.lora.enabled):
        raise ValueError(
            "build_policy on the meta device: adapters need the whole model (build it on a device)"
        )
    model = model_skeleton(_checkpoint_dir(spec), kernels=spec.kernels, dtype=spec.dtype)
    model.config.activation_checkpointing = spec.activation_checkpointing
    return model


def _base(spec: PolicySpec, device: torch.device | str) -> nn.Module:
    """The base model: a checkpoint's weights (none of its adapter), or a seeded random tiny model."""
    if spec.checkpoint:
        model = load_hf_base(_checkpoint_dir(spec), kernels=spec.kernels, dtype=spec.dtype, device=device)
        model.config.activation_checkpointing = spec.activation_checkpointing
        return model
    from rz_agents.model import ModelConfig, Transformer

    overrides = {
        "vocab_size": spec.vocab_size,
        "dtype": spec.dtype or "float32",
        "activation_checkpointing": spec.activation_checkpointing,
        **spec.tiny_overrides,
    }
    if overrides["vocab_size"] is None:
        raise ValueError("PolicySpec.vocab_size: a random tiny model needs its tokenizer's vocabulary size")
    torch.manual_seed(spec.init_seed)
    if spec.model_type in QWEN3_5_TYPES:  # hybrid linear attention (model/qwen3_5.py)
        from rz_agents.model.qwen3_5 import Qwen35ForCausalLM

        moe = spec.model_type in QWEN3_5_MOE_TYPES
        if "vision" in overrides:  # tiny_overrides.vision: with a vision tower (model/qwen3_5_vl.py)
            from rz_agents.model.qwen3_5_vl import Qwen35VLForConditionalGeneration

            vl = Qwen35VLConfig.tiny(moe=moe, **overrides)
            model = Qwen35VLForConditionalGeneration(vl, kernels=spec.kernels)
        else:
            model = Qwen35ForCausalLM(Qwen35Config.tiny(moe=moe, **overrides), kernels=spec.kernels)
    elif spec.model_type == "kimi_linear":  # KDA + MLA + MoE (model/kimi_linear.py)
        from rz_agents.model.kimi_linear import KimiLinearForCausalLM

        model = KimiLinearForCausalLM(KimiLinearConfig.tiny(**overrides), kernels=spec.kernels)
    elif spec.model_type == "qwen3_vl":
        from rz_agents.model.qwen3_vl import Qwen3VLModel

        model = Qwen3VLModel(tiny_vl_config(overrides), kernels=spec.kernels)
    else:
        model = Transformer(ModelConfig.tiny(spec.model_type, **overrides), kernels=spec.kernels)
    model.reset_parameters(seed=spec.init_seed)
    return model.to(device)


def _attach_adapters(model: nn.Module, spec: PolicySpec) -> None:
    """Attach the policy's adapters once and fill them from their files (see ``build_policy``)."""
    files = [saved_adapter(_checkpoint_dir(spec)) if spec.checkpoint else None, spec.adapter]
    sources: list[tuple[LoraConfig, Path | None]] = [(read_peft_config(d), Path(d)) for d in files if d]
    if spec.lora is not None and spec.lora.enabled:
        sources.append((spec.lora, None))
    if sources and isinstance(model.config, (Qwen35Config, KimiLinearConfig)):
        # its layers call the op set's GEMM directly, so an adapter would be attached and never applied
        raise ValueError(
            f"LoRA adapters are not supported for {model.config.model_type} models yet (train the full model)"
        )
    for cfg, directory in sources:
        if directory is None or not has_lora(model):
            # attaches (A seeded, B zero), or checks the adapters already there are this shape and makes
            # them (only them) train
            add_lora(model, cfg)
        if directory is not None:
            load_peft_adapter(model, directory)  # (checks the file's shape against the model's adapters)


def tiny_vl_config(overrides: dict):
    """A random-init Qwen3-VL config: ``overrides`` are the text model's (``ModelConfig.tiny``) with the
    tower's ``VisionConfig`` fields under ``vision`` (its out_hidden_size follows the text hidden_size)."""
    from rz_agents.model.qwen3_vl_config import Qwen3VLConfig, VisionConfig

    text = dict(overrides)
    vision = dict(text.pop("vision", None) or {})
    base = Qwen3VLConfig.tiny(**text)
    if base.text.vocab_size > Qwen3VLConfig.video_token_id:
        # a vocabulary as large as Qwen's (tokenizer: qwen3) has Qwen's vision tokens: take their ids
        ids = {f.name: f.default for f in dataclasses.fields(Qwen3VLConfig) if f.name.endswith("token_id")}
        base = dataclasses.replace(base, **ids)
    fields = {**dataclasses.asdict(base.vision), **vision}
    fields.setdefault("out_hidden_size", base.text.hidden_size)
    try:
        tower = VisionConfig(**fields)
    except TypeError as e:
        raise ValueError(f"model.tiny_overrides.vision: {e}") from None
    return dataclasses.replace(base, vision=tower)
