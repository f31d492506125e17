"""Load what an evaluation samples from: model, tokenizer and chat template of an HF checkpoint directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rz_agents.model.chat_template import ChatTemplate, checkpoint_template, template_for
from rz_agents.model.tokenizer import Tokenizer, qwen3_tokenizer
from rz_agents.model.transformer import Transformer


@dataclass
class CheckpointPolicy:
    """A loaded policy: the model plus the tokenizer and chat template its prompts are written with."""

    model: Transformer
    tokenizer: Tokenizer
    template: ChatTemplate
    name: str


def load_checkpoint_policy(
    checkpoint: str | Path,
    kernels: str = "aligned",
    dtype: str | None = None,
    tokenizer: str | None = None,
    adapter: str | Path | None = None,
) -> CheckpointPolicy:
    """Model from ``checkpoint`` (HF layout, or a packaged model's name) and the tokenizer its prompts use.

    ``adapter``: a PEFT LoRA directory loaded on the model (base + adapter, unmerged: the same arithmetic
    as training); it replaces an adapter the checkpoint holds (its lora_adapter/) of the same shape.

    ``tokenizer`` is a training config's ``tokenizer:`` ("byte", "qwen3", "checkpoint"); None takes the
    directory's tokenizer.json, else Qwen3's. A vision-language (Qwen3-VL) checkpoint gets the template
    training gives its policy (``rollout.policy_template``): image parts render as Qwen3-VL's
    image runs, sized by the checkpoint's preprocessor_config.json.

    Raises FileNotFoundError for a missing directory and ValueError when the tokenizer's ids do not fit
    the model's vocabulary (the message says how to pass the tokenizer the model was trained with).
    """
    from rz_agents.model.packaged import PACKAGED_MODELS, resolve_checkpoint
    from rz_agents.model.policy import PolicySpec, build_policy
    from rz_agents.rollout.policy_template import policy_template

    path = resolve_checkpoint(checkpoint) if str(checkpoint) in PACKAGED_MODELS else Path(checkpoint)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {checkpoint}: no such directory")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint}: no config.json (not an HF checkpoint directory)")
    name = path.name
    if adapter is not None:
        from rz_agents.model.peft_files import adapter_config

        adapter_config(adapter, "adapter")  # (a clear error for a directory that is not one)
        name = f"{path.name}+{Path(adapter).name}"
    model = build_policy(PolicySpec(checkpoint=path, kernels=kernels, dtype=dtype, adapter=adapter)).eval()
    tok, template, described = _tokenizer(path, tokenizer)
    # A vision-language checkpoint renders images with the template training gave its policy (byte or Qwen)
    template = policy_template(template, getattr(model, "vl_config", None))
    if tok.vocab_size > model.config.vocab_size:
        config = path.parent / "config.yaml"  # a run directory's copy of its training config
        config_arg = str(config) if config.is_file() else "TRAINING_CONFIG.yaml"
        raise ValueError(
            f"checkpoint {checkpoint}: {described} has {tok.vocab_size} tokens but the model's vocabulary "
            f"is {model.config.vocab_size}, so the model was trained with another tokenizer. Pass the "
            f"config it was trained with (rz eval uses its tokenizer: field): rz eval {config_arg} "
            f"--checkpoint {checkpoint} ..., or name its tokenizer: rz eval osworld --tokenizer "
            "byte|qwen3|checkpoint ..."
        )
    return CheckpointPolicy(model, tok, template, name)


def _tokenizer(path: Path, kind: str | None) -> tuple[Any, Any, str]:
    """(tokenizer, chat template, a description for messages) of a checkpoint directory."""
    if kind == "byte":
        from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer

        return ByteTokenizer(), ByteChatTemplate(), "the byte tokenizer"
    has_json = (path / "tokenizer.json").is_file()
    if kind == "checkpoint" and not has_json:
        raise FileNotFoundError(f"tokenizer: checkpoint, but {path} has no tokenizer.json")
    if kind in (None, "checkpoint") and has_json:
        tok = Tokenizer.from_dir(path)
        return tok, checkpoint_template(tok, path), "its tokenizer.json"
    if kind not in (None, "qwen3"):
        raise ValueError(f"tokenizer must be byte, qwen3 or checkpoint, got {kind!r}")
    tok = qwen3_tokenizer()
    return tok, template_for(tok), "the Qwen3 tokenizer" + ("" if kind else " (no tokenizer.json there)")
