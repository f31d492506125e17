"""The forward contract's image inputs, shared by the vision-language families (Qwen3-VL, Qwen3.5 with its
vision tower): where a prompt's image placeholders are and how its tokens rotate (M-RoPE), how a trajectory's
images become a packed forward's inputs (one vision call for the batch's pixels) and how an engine chunk's
segments become the forward's keyword inputs.

A model mixes ``VisionLanguageInputs`` in before its decoder class and holds ``vl_config`` (``vision``,
``image_token_id``, ``vision_token_names()`` and a ``text`` part with ``hidden_size``), ``model.visual``
(a model/vision.py ``VisionTower``), ``ops_for``, ``device``, ``config.activation_checkpointing`` and
``lm_head``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rz_agents.model.forward_inputs import Segment
from rz_agents.model.mrope import ImagePositions, mrope_positions
from rz_agents.model.vision import ImageEmbeddings, VisionTower, VLSequence


class VisionLanguageStack(nn.Module):
    """transformers' ``model.`` of a Qwen vision-language checkpoint: ``visual`` and ``language_model``
    (registered in its order); Qwen3-VL and Qwen3.5-VL differ only in the language model."""

    def __init__(self, vision_config, language_model: nn.Module) -> None:
        super().__init__()
        self.visual = VisionTower(vision_config)
        self.language_model = language_model


class VisionLanguageInputs:
    """The image methods of the forward contract (``Transformer``'s, for a model that takes images)."""

    @property
    def visual(self) -> VisionTower:
        return self.model.visual

    @property
    def decoder(self) -> nn.Module:
        """The forward's decoder (embedding, layers, final norm): the language model's."""
        return self.model.language_model

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
