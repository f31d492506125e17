"""Reading an HF checkpoint directory: its config.json (and a vision-language model's
preprocessor_config.json), its (sharded) safetensors by name, and its base model: the model class of its
config with every tensor copied in by name. A saved LoRA adapter (its lora_adapter/ folder) is not read
here: the policy builder (model/policy.py) attaches adapters. safetensors is imported where it is used.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from rz_agents.model.config import ModelConfig
from rz_agents.model.kimi_linear_config import KimiLinearConfig
from rz_agents.model.peft_files import ADAPTER_DIR
from rz_agents.model.qwen3_5_config import MODEL_TYPES as QWEN3_5_TYPES
from rz_agents.model.qwen3_5_config import Qwen35Config
from rz_agents.model.qwen3_5_vl_config import VL_MODEL_TYPES as QWEN3_5_VL_TYPES
from rz_agents.model.qwen3_5_vl_config import Qwen35VLConfig
from rz_agents.model.qwen3_vl_config import ImageProcessing, Qwen3VLConfig
from rz_agents.model.safetensors_dir import (  # noqa: F401 (public names of checkpoint reading)
    INDEX_NAME,
    SINGLE_NAME,
    CheckpointError,
    LazyState,
    _weight_files,
    copy_by_name,
    load_state,
)
from rz_agents.model.transformer import Transformer

PREPROCESSOR_NAME = "preprocessor_config.json"  # HF image processors read it (Qwen-VL models)


def read_config(ckpt_dir: str | os.PathLike, dtype: str | None = None) -> ModelConfig:
    """The checkpoint's ModelConfig (for Qwen3-VL: its language model's; `read_model_config` the whole)."""
    config = read_model_config(ckpt_dir, dtype)
    return config.text if isinstance(config, (Qwen3VLConfig, Qwen35VLConfig)) else config


def read_model_config(
    ckpt_dir: str | os.PathLike, dtype: str | None = None
) -> ModelConfig | Qwen3VLConfig | Qwen35Config:
    """The checkpoint's config: a ModelConfig, a Qwen3VLConfig for model_type qwen3_vl, a Qwen35Config for
    qwen3_5 / qwen3_5_text (its text decoder) or a Qwen35VLConfig for a qwen3_5 one with a vision tower."""
    path = Path(ckpt_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{ckpt_dir}: no config.json")
    d = json.loads(path.read_text())
    if d.get("model_type") == "kimi_linear":
        config = KimiLinearConfig.from_hf(d)
        if dtype is not None:
            config.dtype = dtype
        return config
    if d.get("model_type") in QWEN3_5_VL_TYPES and d.get("vision_config"):  # with its vision tower
        config = Qwen35VLConfig.from_hf(d)
        if dtype is not None:
            config.text.dtype = dtype
        return config
    if d.get("model_type") in QWEN3_5_TYPES:
        config = Qwen35Config.from_hf(d)
        if dtype is not None:
            config.dtype = dtype
        return config
    if d.get("model_type") == "qwen3_vl":
        config = Qwen3VLConfig.from_hf(d, dtype=dtype)
        pre = Path(ckpt_dir) / PREPROCESSOR_NAME
        if pre.is_file():  # absent: rz checkpoints from before it was written, made with the defaults
            try:
                config.vision.image_processing = ImageProcessing.from_hf(json.loads(pre.read_text()))
            except (ValueError, TypeError) as e:
                raise CheckpointError(f"{pre}: {e}") from None
        return config
    return ModelConfig.from_hf(d, dtype=dtype)


def build_model(
    config: ModelConfig | Qwen3VLConfig, kernels: str = "aligned", init: bool = True
) -> Transformer:
    """The model class of `config`: a Transformer, or a Qwen3VLModel (a Transformer with a vision tower)."""
    if isinstance(config, Qwen3VLConfig):
        from rz_agents.model.qwen3_vl import Qwen3VLModel

        return Qwen3VLModel(config, kernels=kernels, init=init)
    if isinstance(config, Qwen35VLConfig):
        from rz_agents.model.qwen3_5_vl import Qwen35VLForConditionalGeneration

        return Qwen35VLForConditionalGeneration(config, kernels=kernels)
    if isinstance(config, Qwen35Config):
        from rz_agents.model.qwen3_5 import Qwen35ForCausalLM

        return Qwen35ForCausalLM(config, kernels=kernels).to(config.torch_dtype)
    if isinstance(config, KimiLinearConfig):
        from rz_agents.model.kimi_linear import KimiLinearForCausalLM

        return KimiLinearForCausalLM(config, kernels=kernels)
    return Transformer(config, kernels=kernels, init=init)


def model_config_of(config: ModelConfig | Qwen3VLConfig) -> ModelConfig:
    """The decoder's ModelConfig of a model config (Qwen3-VL: its language model's)."""
    return config.text if isinstance(config, (Qwen3VLConfig, Qwen35VLConfig)) else config


def _prediction_layer(name: str, config: ModelConfig) -> bool:
    """A tensor of DeepSeek-V3's multi-token-prediction layer (stored as model.layers.{num_hidden_layers}.*):
    not part of the causal LM, skipped as transformers skips it."""
    if config.model_type != "deepseek_v3" or not name.startswith("model.layers."):
        return False
    return int(name.split(".")[2]) >= config.num_hidden_layers


def model_skeleton(
    ckpt_dir: str | os.PathLike, kernels: str = "aligned", dtype: str | None = None
) -> Transformer:
    """The checkpoint's model on the meta device (shapes and dtype, no storage): for learner ranks that shard
    it first and then take only their shards of each tensor (``LazyState``)."""
    config = read_model_config(ckpt_dir, dtype)
    with torch.device("meta"):
        return build_model(config, kernels=kernels, init=False)


def load_hf_base(
    ckpt_dir: str | os.PathLike,
    kernels: str = "aligned",
    dtype: str | None = None,
    device: torch.device | str = "cpu",
) -> Transformer:
    """The checkpoint's base model on `device` (every tensor of the directory, none of its saved adapter:
    ``saved_adapter`` names that folder); every parameter must be present."""
    full_config = read_model_config(ckpt_dir, dtype)
    if isinstance(full_config, Qwen35VLConfig):  # its own reader, as the text model's
        from rz_agents.model.qwen3_5_vl import load_qwen3_5_vl

        return load_qwen3_5_vl(ckpt_dir, kernels, dtype=full_config.text.torch_dtype).to(device)
    if isinstance(full_config, Qwen35Config):  # its own reader: HF's VL prefixes and mtp.* tensors
        from rz_agents.model.qwen3_5 import load_qwen3_5

        return load_qwen3_5(ckpt_dir, kernels, dtype=full_config.torch_dtype).to(device)
    if isinstance(full_config, KimiLinearConfig):  # its own reader: `mlp.` / `block_sparse_moe.` names
        from rz_agents.model.kimi_linear import load_kimi_linear

        return load_kimi_linear(ckpt_dir, kernels, dtype=full_config.torch_dtype).to(device)
    config = model_config_of(full_config)
    # Build without initialising (every parameter is overwritten below): a random init of a multi-GB
    # model would cost more than reading it.
    with torch.device("meta"):
        model = build_model(full_config, kernels=kernels, init=False)
    model.to_empty(device=device)
    if config.tie_word_embeddings:  # to_empty gives each reference its own tensor: tie them again
        model.lm_head.weight = model.get_input_embeddings().weight
    state = load_state(ckpt_dir)
    expected = set(model.state_dict())
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
        expected.discard("lm_head.weight")
    # transformers never stores rotary buffers; some exports carry them.
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    state = {k: v for k, v in state.items() if not _prediction_layer(k, config)}
    copy_by_name(model.state_dict(), state, expected, ckpt_dir, config.model_type)
    return model


def saved_adapter(ckpt_dir: str | os.PathLike) -> Path | None:
    """The PEFT adapter folder a LoRA model's checkpoint holds (``save_hf_checkpoint`` writes it), or None."""
    adapter = Path(ckpt_dir) / ADAPTER_DIR
    return adapter if (adapter / "adapter_config.json").is_file() else None
