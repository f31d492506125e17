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

from rz_agents.model.forward_inputs import Segment
from rz_agents.model.logprobs import packed_token_logprobs
from rz_agents.model.mrope import ImagePositions, mrope_positions, mrope_table
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig
from rz_agents.model.transformer import (
    DecoderStack,
    Transformer,
    _Context,
)
from rz_agents.model.vision import ImageEmbeddings, LayerNorm, VisionTower, VLSequence  # noqa: F401 (its home)
from rz_kernels import get_ops
from rz_kernels.attention import verify_attention
from rz_kernels.logprobs import token_logprobs_of_logits


class _VisionLanguageStack(nn.Module):
    """HF's `model.` prefix of Qwen3-VL: `visual` and `language_model` (registered in HF's order)."""

    def __init__(self, config: Qwen3VLConfig) -> None:
        super().__init__()
        self.visual = VisionTower(config.vision)
        self.language_model = DecoderStack(config.text)


class Qwen3VLModel(Transformer):
    """Qwen3-VL for conditional generation. `config` is the text part (what the decoder layers read);
    `vl_config` the whole model's."""

    def __init__(self, config: Qwen3VLConfig, kernels: str = "aligned", init: bool = True) -> None:
        get_ops(kernels)  # reject an unknown name before building the tower
        # the decoder's Transformer (its config: the text part) over the tower + language model stack
        super().__init__(config.text, kernels, init, stack=_VisionLanguageStack(config))
        self.vl_config = config

    @property
    def visual(self) -> VisionTower:
        return self.model.visual

    def hf_config(self) -> dict:
        return self.vl_config.to_hf()

    # ---- the forward contract's image inputs (Transformer's, for a model that takes them) -------------
    takes_images = True

    def image_positions(self, prompt: list[int], grids: torch.Tensor) -> ImagePositions:
        """Transformer.image_positions: M-RoPE positions of the prompt, its ``<|image_pad|>`` slots, and
        t*h*w / merge^2 placeholders per image."""
        merge = self.vl_config.vision.spatial_merge_size
        token = self.vl_config.image_token_id
        rope, delta = mrope_positions(prompt, grids.tolist(), token, merge)
        slots = torch.tensor([i for i, t in enumerate(prompt) if t == token])
        counts = [int(t * h * w) // merge**2 for t, h, w in grids.tolist()]
        return ImagePositions(rope, delta, slots, counts)

    def image_row_bytes(self) -> int:
        """Transformer.image_row_bytes: a placeholder's embedding row and its deepstack rows."""
        vl = self.vl_config
        row = vl.text.hidden_size * (1 + len(vl.vision.deepstack_visual_indexes))
        return row * self.lm_head.weight.element_size()

    def token_names(self) -> dict[int, str]:
        """Transformer.token_names: the vision placeholders' (``<|vision_start|>``, ``<|image_pad|>``)."""
        return self.vl_config.vision_token_names()

    def scored_sequence(self, tokens: list[int], images: list[bytes], loss_mask: list) -> VLSequence:
        """Transformer.scored_sequence: the trajectory's images preprocessed as the rollout's template did
        for the engine (``png_image_inputs``), its placeholders the template's (not sampled) ones: a sampled
        ``<|image_pad|>`` is an ordinary token to the engine, and so to the learner."""
        if not images:
            return VLSequence(tokens)
        from rz_agents.model.vl_processor import png_image_inputs

        pixels, grids = png_image_inputs(images, self.vl_config.vision)
        ids = torch.as_tensor(tokens, dtype=torch.long)
        marks = (ids == self.vl_config.image_token_id) & ~torch.as_tensor(loss_mask, dtype=torch.bool)
        return VLSequence(tokens, grids, pixels, placeholders=marks)

    def packed_inputs(self, sequences: Sequence, ids: list[torch.Tensor]) -> dict:
        """Transformer.packed_inputs: the packed whole sequences as ``extra_inputs`` segments: every token's
        3D positions, the sequences' images (the pixel ones encoded in one vision call: an image's encoding
        does not depend on its batch, so this equals encoding each alone, bit for bit) and their
        placeholders. Sequences may mix pixels, cached embeddings and no images at all (token lists)."""
        if min(i.numel() for i in ids) < 1:
            raise ValueError("every sequence needs at least one token")
        seqs = [
            s if isinstance(s, VLSequence) else VLSequence(i) for s, i in zip(sequences, ids, strict=True)
        ]
        for s in seqs:
            if s.pixel_values is not None and s.images is not None:
                raise ValueError("a VLSequence carries pixel_values or images (already encoded), not both")
        pixel_seqs = [s for s in seqs if s.pixel_values is not None]
        encoded: list[ImageEmbeddings] = []
        if pixel_seqs:
            grids = torch.cat([torch.as_tensor(s.image_grid_thw).reshape(-1, 3) for s in pixel_seqs])
            pixels = torch.cat([s.pixel_values for s in pixel_seqs]).to(self.device)
            encoded = self.encode_images(pixels, grids).split()
        segments = []
        for i, s in zip(ids, seqs, strict=True):
            rope = (
                None
                if s.image_grid_thw is None
                else self.rope_positions(i, s.image_grid_thw, s.placeholders)[0]
            )
            images = slots = None
            if s.pixel_values is not None:
                n = torch.as_tensor(s.image_grid_thw).reshape(-1, 3).shape[0]
                images, encoded = ImageEmbeddings.cat(encoded[:n]), encoded[n:]
            elif s.images is not None:
                images = s.images
            if images is not None:
                mark = (i == self.vl_config.image_token_id) if s.placeholders is None else s.placeholders
                slots = torch.as_tensor(mark, dtype=torch.bool).reshape(-1).nonzero().squeeze(1)
            segments.append(Segment(0, i.numel(), rope, images, slots))
        return self.extra_inputs(segments)

    def extra_inputs(self, segments: list[Segment]) -> dict:
        """Transformer.extra_inputs: the segments' 3D positions (a plain segment's: its indices on every
        axis), their image rows and the stream indices those rows go to, on this model's device. None
        needed when every segment is plain (the forward then rotates by the positions, the same rows)."""
        if all(s.plain for s in segments):
            return {}
        device = self.device
        ropes, parts, slots = [], [], []
        offset = 0
        for s in segments:
            if s.rope is not None:
                ropes.append(s.rope)
            else:
                ropes.append(torch.arange(s.start, s.start + s.length).view(1, -1).expand(3, -1))
            if s.images is not None:
                parts.append(s.images)
                slots.append(s.slots.to(device) + offset)
            offset += s.length
        return dict(
            rope_positions=torch.cat(ropes, dim=1).to(device),
            images=ImageEmbeddings.cat(parts) if parts else None,
            image_slots=torch.cat(slots) if slots else None,
        )

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

    def encode_images(
        self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor | list
    ) -> ImageEmbeddings:
        """The vision tower's embeddings of packed images (rows in image order; `.split()` per image).

        Under ``activation_checkpointing`` a tower being trained recomputes its blocks in the backward (a
        frozen one keeps no graph to checkpoint)."""
        recompute = (
            self.config.activation_checkpointing
            and torch.is_grad_enabled()
            and any(p.requires_grad for p in self.visual.parameters())
        )
        return self.visual(pixel_values, image_grid_thw, self.ops_for(pixel_values.device), recompute)

    def rope_positions(
        self,
        tokens: Sequence[int] | torch.Tensor,
        image_grid_thw: torch.Tensor | list | None = None,
        placeholders: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, int]:
        """(3D positions [3, T], delta) of one sequence's tokens (see model/mrope.py). Without grids every
        token is text (placeholder tokens too, embedded as ordinary tokens: HF's behaviour without pixels).
        ``placeholders`` ([T] bool, None: every image_token_id) marks the image placeholders."""
        ids = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        if image_grid_thw is None:
            return torch.arange(ids.numel()).view(1, -1).expand(3, -1), 0
        grids = torch.as_tensor(image_grid_thw).reshape(-1, 3).tolist()
        v = self.vl_config
        return mrope_positions(
            ids, grids, v.image_token_id, v.vision.spatial_merge_size, placeholders=placeholders
        )

    @property
    def decoder(self) -> nn.Module:
        """Transformer.decoder: the language model's embedding, layers and final norm."""
        return self.model.language_model

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
