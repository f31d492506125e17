"""Qwen3-VL: the vision tower (model/vision.py) feeding a Qwen3 decoder with multimodal RoPE and deepstack.

The language model is the shared decoder of model/transformer.py (same layers, same op set, same paged KV
cache), with three differences, all in `forward`:
- image placeholder tokens take the vision tower's merged embeddings instead of their token embeddings;
- RoPE rotates by 3D positions (model/mrope.py) while attention stays ordered by the token index `positions`
  (the KV cache is addressed by token index as for any model);
- after decoder layer i < len(deepstack), the placeholders' hidden states get deepstack feature i added.

Images are encoded separately (`encode_images`) and passed in as `ImageEmbeddings`: the engine encodes each
image once at prefill and keeps the result with the sequence (the encoding of an image does not depend on
the other images of the call, so that is the same bits as the learner encoding all of a batch's images in
one call). Parameter names are HF's Qwen3VLForConditionalGeneration names (model.visual.*,
model.language_model.*, lm_head.weight).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rz_agents.model.logprobs import packed_token_logprobs
from rz_agents.model.mrope import mrope_table
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig
from rz_agents.model.transformer import (
    DecoderStack,
    Transformer,
    _Context,
)
from rz_agents.model.vision import ImageEmbeddings, LayerNorm, VisionTower, VLSequence  # noqa: F401 (its home)
from rz_agents.model.vl_inputs import VisionLanguageInputs, VisionLanguageStack
from rz_kernels import get_ops
from rz_kernels.attention import verify_attention
from rz_kernels.logprobs import token_logprobs_of_logits


class Qwen3VLModel(VisionLanguageInputs, Transformer):
    """Qwen3-VL for conditional generation. `config` is the text part (what the decoder layers read);
    `vl_config` the whole model's."""

    def __init__(self, config: Qwen3VLConfig, kernels: str = "aligned", init: bool = True) -> None:
        get_ops(kernels)  # reject an unknown name before building the tower
        # the decoder's Transformer (its config: the text part) over the tower + language model stack
        stack = VisionLanguageStack(config.vision, DecoderStack(config.text))
        super().__init__(config.text, kernels, init, stack=stack)
        self.vl_config = config

    def hf_config(self) -> dict:
        return self.vl_config.to_hf()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.language_model.embed_tokens

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, seed: int | None = None) -> None:
        super().reset_parameters(std, seed)
        for m in self.modules():  # layer norms start as identities (their biases stay random: see super)
            if isinstance(m, LayerNorm):
                m.weight.fill_(1.0)

    def verify_kernels(self) -> None:
        """Transformer.verify_kernels, plus the vision tower's attention shape (one query head per kv
        head)."""
        super().verify_kernels()
        if self.kernels == "aligned" and self.device.type == "cpu":
            verify_attention(1, self.vl_config.vision.head_dim)

    def _image_inputs(
        self,
        ctx: _Context,
        tokens: torch.Tensor,
        shape: torch.Size,
        rope_positions: torch.Tensor | None,
        images: ImageEmbeddings | None,
        image_slots: torch.Tensor | None,
        text_rope_positions: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """Transformer.forward's image inputs (the forward is Transformer's; these are its optional inputs):

        rope_positions: [3, T] (or [3, B, S]) the tokens' 3D positions (None: text only, all three axes =
        ``positions``).
        images: the embeddings of the image placeholders (``image_token_id``) among ``tokens``, one row per
        placeholder in stream order (a chunk passes the rows of the placeholders it holds). Without it, the
        placeholder tokens are embedded as ordinary tokens (as HF does when no pixels are given).
        image_slots: [rows of images] the stream indices those rows go to (None: every ``image_token_id``
        token of the stream, in order; the engine passes its prompts' placeholders only).
        text_rope_positions: [T] instead of ``rope_positions`` when every token is text (all three axes
        equal: the engine's decode step, index + the sequence's M-RoPE delta): the rotation rows are read
        from the RoPE table at these positions, the same values the 3D gather gives such a token, with no
        gather and no read-back (the CUDA-graph-capturable form). The caller keeps them in [0, top position].
        """
        t = tokens.shape[0]
        if rope_positions is None:
            rope_positions = ctx.positions.view(1, t).expand(3, t)
        elif len(shape) == 2:  # [3, B, S] -> [3, T], as the batch was flattened
            rope_positions = rope_positions.reshape(3, -1)
        if rope_positions.shape != (3, t):
            raise ValueError(f"rope_positions must be [3, {t}], got {tuple(rope_positions.shape)}")
        if text_rope_positions is not None:
            if images is not None or text_rope_positions.shape != (t,):
                raise ValueError(f"text_rope_positions must be [{t}] and come without images")
            ctx.rope_positions = text_rope_positions  # ctx.rope: the model's table, checked by _Context
        else:
            ctx.rope = mrope_table(self.rope, rope_positions, self.vl_config.mrope_section)
            ctx.rope_positions = torch.arange(t, device=tokens.device)
        if images is None:
            return None
        slots = image_slots
        if slots is None:
            slots = (tokens == self.vl_config.image_token_id).nonzero().squeeze(1)
        if slots.numel() != images.embeds.shape[0]:
            raise ValueError(
                f"{slots.numel()} image placeholder tokens but {images.embeds.shape[0]} image embedding rows"
            )
        return slots


def sequence_logprobs(
    model: Qwen3VLModel,
    tokens: Sequence[int] | torch.Tensor,
    pixel_values: torch.Tensor | None = None,
    image_grid_thw: torch.Tensor | list | None = None,
    images: ImageEmbeddings | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [T, vocab] fp32, log-probs [T-1] of tokens[1:]) of one sequence with its images.

    The images come as pixels (``pixel_values`` + ``image_grid_thw``: encoded here) or already encoded
    (``images``, e.g. cached by an engine; ``image_grid_thw`` still gives their grids for the 3D positions).
    """
    if pixel_values is not None and images is not None:
        raise ValueError("pass pixel_values or images (already encoded), not both")
    if (pixel_values is not None or images is not None) and image_grid_thw is None:
        raise ValueError("images need image_grid_thw (their grids give the tokens' 3D positions)")
    device = model.device
    ids = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    rope, _ = model.rope_positions(ids, image_grid_thw)
    if pixel_values is not None:
        images = model.encode_images(pixel_values.to(device), image_grid_thw)
    ids = ids.to(device)
    hidden = model(
        ids, torch.arange(ids.numel(), device=device), rope_positions=rope.to(device), images=images
    )
    logits = model.logits(hidden)
    return logits, token_logprobs_of_logits(logits[:-1], ids[1:], 1.0, 0, 1.0)


def packed_logprobs(
    model: Qwen3VLModel,
    sequences: Sequence[VLSequence],
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> list[torch.Tensor]:
    """``packed_token_logprobs`` (model/logprobs.py: the one packer, which takes VLSequences too), under this
    name for the callers that use it."""
    return packed_token_logprobs(model, sequences, temperature, top_k, top_p)
