"""HF checkpoint directories: config.json + (sharded) safetensors, read and written by name.

Our parameter names are the HF on-disk names, so loading is a copy by name. Tied embeddings are
written once (no lm_head.weight), as transformers does. Writes are atomic: files go to a sibling
temporary directory that is renamed into place. Reading lives in model/hf_files.py (re-exported here);
``load_hf_checkpoint`` is the policy builder's (model/policy.py) model of a directory, with its saved
adapter. safetensors is imported where it is used, not at module level: importing this module (the learner
imports it) needs only torch.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from rz_agents.model.hf_files import (  # noqa: F401 (the public names of checkpoint reading)
    INDEX_NAME,
    PREPROCESSOR_NAME,
    SINGLE_NAME,
    CheckpointError,
    LazyState,
    build_model,
    load_hf_base,
    load_state,
    model_config_of,
    model_skeleton,
    read_config,
    read_model_config,
    saved_adapter,
)
from rz_agents.model.policy import PolicySpec, build_policy
from rz_agents.model.transformer import Transformer


def _shards(state: dict[str, torch.Tensor], max_shard_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in state.items():
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += n
    return shards


def save_hf_checkpoint(
    model: Transformer,
    out_dir: str | os.PathLike,
    max_shard_bytes: int = 2 * 1024**3,
    extra_files: dict | None = None,
) -> Path:
    """Write model as an HF checkpoint directory (transformers' AutoModelForCausalLM loads it)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    # LoRA adapters are not base weights: they go to <out>/lora_adapter as a PEFT directory
    # (model/peft_files.py)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if ".lora_" not in k}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(model.hf_config(), indent=2))
        vl = getattr(model, "vl_config", None)
        if vl is not None:  # the image preprocessing the model was trained with, where HF processors read it
            processing = vl.vision.image_processing.to_hf(vl.vision)
            (tmp / PREPROCESSOR_NAME).write_text(json.dumps(processing, indent=2))
        shards = _shards(state, max_shard_bytes)
        if len(shards) == 1:
            save_file(shards[0], str(tmp / SINGLE_NAME), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, shard in enumerate(shards):
                name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(tmp / name), metadata={"format": "pt"})
                weight_map.update(dict.fromkeys(shard, name))
            total = sum(t.numel() * t.element_size() for t in state.values())
            (tmp / INDEX_NAME).write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
            )
        if any(".lora_" in k for k in model.state_dict()):
            from rz_agents.model.peft_files import ADAPTER_DIR, save_peft_adapter

            save_peft_adapter(model, tmp / ADAPTER_DIR)
        for name, content in (extra_files or {}).items():
            (tmp / name).write_text(content if isinstance(content, str) else json.dumps(content, indent=2))
        if out.exists():
            old = out.with_name(out.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def load_hf_checkpoint(
    ckpt_dir: str | os.PathLike,
    kernels: str = "aligned",
    dtype: str | None = None,
    device: torch.device | str = "cpu",
) -> Transformer:
    """Build a Transformer from an HF checkpoint directory on `device`; every parameter must be present. A
    LoRA model's checkpoint (its lora_adapter/ folder, written by ``save_hf_checkpoint``) loads base +
    adapter. (``build_policy`` of a ``PolicySpec`` naming the directory.)"""
    return build_policy(PolicySpec(checkpoint=str(ckpt_dir), kernels=kernels, dtype=dtype), device)
