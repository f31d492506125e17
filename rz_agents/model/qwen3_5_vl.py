"""Qwen3.5 with its vision tower (transformers' ``Qwen3_5ForConditionalGeneration``): the hybrid text decoder
of model/qwen3_5.py fed images by Qwen3-VL's tower (model/vision.py), rotated by interleaved M-RoPE.

What differs from Qwen3-VL, and where it lives:
- the tower is Qwen3-VL's without deepstack (no mid-stack image features): the same `VisionTower` with no
  deepstack mergers, so the same bits for the same weights;
- the decoder is Qwen3.5's (Gated DeltaNet + gated full attention), whose full-attention layers rotate only
  the first ``rotary_dim`` dimensions of a head: the M-RoPE split (``mrope_section``) divides those
  ``rotary_dim / 2`` frequencies between the axes, the rows gathered from the decoder's own RoPE table
  (model/mrope.py ``mrope_table``, as Qwen3-VL's);
- the linear-attention layers see positions only as the order of the stream, so images change nothing there.

The image inputs of the forward contract (positions of a prompt's images, a trajectory's images packed for
the learner, an engine chunk's segments) are Qwen3-VL's (model/vl_inputs.py). The engine keeps the hybrid
cache of the text model; a decode step rotates by index + the sequence's M-RoPE delta as for Qwen3-VL.
Parameter names are transformers' (``model.visual.*``, ``model.language_model.*``, ``lm_head.weight``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from rz_agents.model.mrope import mrope_table
from rz_agents.model.qwen3_5 import Qwen35ForCausalLM, _Batch, _Stack
from rz_agents.model.qwen3_5_vl_config import Qwen35VLConfig
from rz_agents.model.vision import LayerNorm
from rz_agents.model.vl_inputs import VisionLanguageInputs, VisionLanguageStack
from rz_kernels import RopeTable, get_ops
from rz_kernels.attention import verify_attention


class Qwen35VLForConditionalGeneration(VisionLanguageInputs, Qwen35ForCausalLM):
    """Qwen3.5 vision-language model. ``config`` is the text decoder's (what the layers and the engine's
    hybrid cache read); ``vl_config`` the whole model's."""

    def __init__(self, config: Qwen35VLConfig, kernels: str = "aligned") -> None:
        get_ops(kernels)  # reject an unknown name before building the tower
        super().__init__(config.text, kernels, stack=VisionLanguageStack(config.vision, _Stack(config.text)))
        self.vl_config = config

    def hf_config(self) -> dict:
        """This model's config.json (``Qwen3_5ForConditionalGeneration`` reads it)."""
        dtype = str(self.lm_head.weight.dtype).removeprefix("torch.")
        return {**self.vl_config.to_hf(), "dtype": dtype}

    def packed_inputs(self, sequences: Sequence, ids: list[torch.Tensor]) -> dict:
        """The learner's packed forward inputs: the images' (model/vl_inputs.py) and each sequence's length
        (the linear-attention layers start each sequence's state at its first token)."""
        return {**super().packed_inputs(sequences, ids), "seq_lens": [int(i.numel()) for i in ids]}

    def verify_kernels(self) -> None:
        """The text model's start-up guards, plus the vision tower's attention shape (one query head per
        kv head)."""
        super().verify_kernels()
        if self.kernels == "aligned" and self.device.type == "cpu":
            verify_attention(1, self.vl_config.vision.head_dim)

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, seed: int | None = None) -> None:
        """The text model's random init, the tower's layer norms at identity (weight 1, bias 0)."""
        super().reset_parameters(std, seed)
        for m in self.visual.modules():
            if isinstance(m, LayerNorm):
                m.weight.fill_(1.0)
                m.bias.zero_()

    def _embed(self, tokens, shape, batch: _Batch, rope_positions, images, image_slots, text_rope_positions):
        """Qwen35ForCausalLM._embed with image inputs: ``rope_positions`` [3, T] (or [3, B, S]) the tokens'
        3D positions, ``images`` the embeddings of the placeholders at ``image_slots`` (None: every
        ``image_token_id`` of the stream), as Qwen3VLModel's forward takes them. Without them (text only, or
        the engine's decode step with ``text_rope_positions``) the text model's rotation."""
        if rope_positions is None and images is None and image_slots is None:
            return super()._embed(tokens, shape, batch, None, None, None, text_rope_positions)
        t = tokens.shape[0]
        if text_rope_positions is not None:
            raise ValueError("text_rope_positions come without rope_positions or images")
        if rope_positions is None:
            rope_positions = batch.positions.view(1, t).expand(3, t)
        elif len(shape) == 2:  # [3, B, S] -> [3, T], as the batch was flattened
            rope_positions = rope_positions.reshape(3, -1)
        if rope_positions.shape != (3, t):
            raise ValueError(f"rope_positions must be [3, {t}], got {tuple(rope_positions.shape)}")
        # the rows gathered from the decoder's table: a text token's are its plain RoPE rows, bit for bit
        batch.rope = mrope_table(self.rope, rope_positions, self.vl_config.mrope_section)
        batch.rope_positions = torch.arange(t, device=tokens.device)
        x = self.decoder.embed_tokens(tokens)
        if images is None:
            return x
        slots = image_slots
        if slots is None:
            slots = (tokens == self.vl_config.image_token_id).nonzero().squeeze(1)
        if slots.numel() != images.embeds.shape[0]:
            raise ValueError(
                f"{slots.numel()} image placeholder tokens but {images.embeds.shape[0]} image embedding rows"
            )
        return x.index_put((slots,), images.embeds.to(x.dtype))


def load_qwen3_5_vl(
    ckpt_dir: str | os.PathLike, kernels: str = "aligned", dtype: torch.dtype | None = None
) -> Qwen35VLForConditionalGeneration:
    """A Qwen3.5 vision-language model from a transformers checkpoint directory, every tensor by name
    (multi-token-prediction ``mtp.*`` tensors skipped, as transformers skips them); a missing or unexpected
    tensor is an error naming it."""
    from rz_agents.model.safetensors_dir import load_state

    path = Path(ckpt_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{ckpt_dir}: no config.json")
    config = Qwen35VLConfig.from_hf(json.loads(path.read_text()))
    if dtype is not None:
        config.text.dtype = str(dtype).removeprefix("torch.")
    with torch.device("meta"):
        model = Qwen35VLForConditionalGeneration(config, kernels)
    state = {k: v for k, v in load_state(ckpt_dir).items() if not k.startswith("mtp.")}
    if config.text.tie_word_embeddings:
        state.setdefault("lm_head.weight", state.get("model.language_model.embed_tokens.weight"))
    expected = dict(model.named_parameters(remove_duplicate=False))
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{ckpt_dir}: checkpoint does not match the model: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    cast = config.text.torch_dtype
    model.load_state_dict({k: v.to(cast) for k, v in state.items()}, strict=True, assign=True)
    if config.text.tie_word_embeddings:
        model.lm_head.weight = model.decoder.embed_tokens.weight
    text = config.text
    model.rope = RopeTable(text.rotary_dim, text.rope_theta, text.max_position_embeddings)
    return model
