"""Load what an evaluation samples from: model, tokenizer and chat template of an HF checkpoint directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rz_agents.model.chat_template import ChatTemplate, template_for
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
    checkpoint: str | Path, kernels: str = "aligned", dtype: str | None = None
) -> CheckpointPolicy:
    """Model from ``checkpoint`` (HF layout, or a packaged model's name); tokenizer from its tokenizer.json, else the Qwen3 tokenizer.

    Raises FileNotFoundError for a missing directory and ValueError when the tokenizer's ids do not
    fit the model's vocabulary.
    """
    from rz_agents.model.checkpoint import load_hf_checkpoint
    from rz_agents.model.packaged import PACKAGED_MODELS, resolve_checkpoint

    path = resolve_checkpoint(checkpoint) if str(checkpoint) in PACKAGED_MODELS else Path(checkpoint)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {checkpoint}: no such directory")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint}: no config.json (not an HF checkpoint directory)")
    model = load_hf_checkpoint(path, kernels=kernels, dtype=dtype).eval()
    tokenizer = Tokenizer.from_dir(path) if (path / "tokenizer.json").is_file() else qwen3_tokenizer()
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(
            f"checkpoint {checkpoint}: tokenizer has {tokenizer.vocab_size} tokens but the model's "
            f"vocabulary is {model.config.vocab_size}; put the matching tokenizer.json in the directory"
        )
    return CheckpointPolicy(model, tokenizer, template_for(tokenizer), path.name)
