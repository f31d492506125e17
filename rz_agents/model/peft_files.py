"""LoRA adapters as a PEFT directory: ``adapter_config.json`` + ``adapter_model.safetensors``.

The tensor names are PEFT's: ``base_model.model.`` + the model's own parameter name
(``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``), A of shape [r, in] and B [out, r], with
the scale ``lora_alpha / r``: exactly rz's adapters (model/lora.py), so saving and loading are copies by name.
A PEFT file that needs something rz's adapters do not compute (per-layer ranks or alphas, rsLoRA, DoRA,
biases, extra trained modules, fan_in_fan_out) is refused naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from rz_agents.model.lora import LoraConfig, adapter_names, has_lora

PREFIX = "base_model.model."
CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_DIR = "lora_adapter"  # where an HF checkpoint directory of an adapted model keeps its adapter


def save_peft_adapter(model: nn.Module, out_dir: str | Path, base_model: str | None = None) -> Path:
    """Write ``model``'s adapters (tensors in the model's dtype) as a PEFT directory; returns it."""
    from safetensors.torch import save_file

    cfg: LoraConfig | None = getattr(model, "lora_config", None)
    if cfg is None or not has_lora(model):
        raise ValueError("the model has no LoRA adapters to save")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    tensors = {PREFIX + k: state[k].detach().cpu().contiguous() for k in adapter_names(model)}
    save_file(tensors, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": sorted(cfg.target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "init_lora_weights": True,
        "inference_mode": True,
    }
    (out / CONFIG_NAME).write_text(json.dumps(config, indent=2))
    return out


def read_peft_config(adapter_dir: str | Path) -> LoraConfig:
    """The LoraConfig a PEFT directory describes; ValueError naming a field rz cannot compute."""
    raw = json.loads((Path(adapter_dir) / CONFIG_NAME).read_text())
    if raw.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{adapter_dir}: peft_type {raw.get('peft_type')!r} is not LORA")
    for key, ok in (
        ("rank_pattern", {}), ("alpha_pattern", {}), ("use_rslora", False), ("use_dora", False),
        ("bias", "none"), ("modules_to_save", None), ("fan_in_fan_out", False), ("layers_to_transform", None),
    ):  # fmt: skip
        if raw.get(key) not in (None, ok):
            raise ValueError(
                f"{adapter_dir}: adapter_config.json {key}={raw[key]!r} is not supported by rz's LoRA"
            )
    targets = raw["target_modules"]
    if isinstance(targets, str):
        raise ValueError(
            f"{adapter_dir}: target_modules as a regex ({targets!r}) is not supported; list the names"
        )
    # PEFT trains with dropout; the adapter itself is the same function without it (inference)
    return LoraConfig(rank=int(raw["r"]), alpha=float(raw["lora_alpha"]), target_modules=sorted(targets))


def adapter_config(adapter_dir: str | Path, field: str) -> LoraConfig:
    """``read_peft_config`` of a directory named by ``field`` (a config field or a flag), with a ValueError
    naming it when the directory is not a PEFT adapter directory."""
    if not (Path(adapter_dir) / CONFIG_NAME).is_file():
        raise ValueError(f"{field} {adapter_dir}: no {CONFIG_NAME} there (not a PEFT adapter directory)")
    return read_peft_config(adapter_dir)


@torch.no_grad()
def load_peft_adapter(model: nn.Module, adapter_dir: str | Path) -> LoraConfig:
    """Load a PEFT directory's adapters into ``model``'s adapters (attached by ``model.policy.build_policy``:
    the one place adapters are attached); exact copies (cast to the model's dtype). Every adapter tensor of
    the model must be in the file and vice versa."""
    from safetensors.torch import load_file

    cfg = read_peft_config(adapter_dir)
    if not has_lora(model):
        raise ValueError(
            f"{adapter_dir}: the model has no adapters to load it into (build it with "
            "model.policy.build_policy and PolicySpec.adapter)"
        )
    have: LoraConfig = model.lora_config
    if (have.rank, have.alpha, sorted(have.target_modules)) != (cfg.rank, cfg.alpha, cfg.target_modules):
        raise ValueError(
            f"{adapter_dir}: adapter (r={cfg.rank}, alpha={cfg.alpha}, {cfg.target_modules}) does not "
            f"match the model's (r={have.rank}, alpha={have.alpha}, {sorted(have.target_modules)})"
        )
    tensors = load_file(str(Path(adapter_dir) / WEIGHTS_NAME))
    names = adapter_names(model)
    # PEFT names tensors without the adapter name ("default") in its files; accept it with one too
    found = {k.removeprefix(PREFIX).replace(".default.weight", ".weight"): v for k, v in tensors.items()}
    if sorted(found) != sorted(names):
        missing, extra = sorted(set(names) - set(found)), sorted(set(found) - set(names))
        raise ValueError(
            f"{adapter_dir}: adapter tensors do not match the model: missing {missing[:3]}, "
            f"unexpected {extra[:3]}"
        )
    params = dict(model.named_parameters())
    for name in names:
        src, dst = found[name], params[name]
        if src.shape != dst.shape:
            raise ValueError(
                f"{adapter_dir}: {name} has shape {tuple(src.shape)}, the model {tuple(dst.shape)}"
            )
        dst.copy_(src.to(dst.dtype))
    return cfg
