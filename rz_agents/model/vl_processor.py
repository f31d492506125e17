"""Images -> the vision tower's inputs; the chat template's image placeholders -> one token per merged patch.

Preprocessing (resize to a multiple of patch x merge, rescale, normalise, cut into patches in merge-window
order) is transformers' own Qwen2-VL image processor, the one Qwen3-VL's processor uses, on its PIL backend
(no torchvision needed); transformers is imported where it is used.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rz_agents.model.qwen3_vl_config import VisionConfig


def preprocess_images(
    images: Sequence, vision: VisionConfig, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pixel_values [patches, patch_dim] fp32, image_grid_thw [images, 3]) of PIL images for `vision`.

    Each image is resized (aspect kept) so its sides are multiples of patch_size * spatial_merge_size and its
    area lies in [min_pixels, max_pixels]."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil(
        patch_size=vision.patch_size,
        temporal_patch_size=vision.temporal_patch_size,
        merge_size=vision.spatial_merge_size,
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
    )
    out = processor(images=list(images), return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def expand_image_pads(
    tokens: Sequence[int], image_grid_thw: torch.Tensor | list, image_token_id: int, spatial_merge_size: int
) -> list[int]:
    """The chat template's one `<|image_pad|>` per image widened to t*h*w / merge^2 copies (as the processor
    does), image i taking grid i."""
    grids = torch.as_tensor(image_grid_thw).reshape(-1, 3).tolist()
    pads = [i for i, t in enumerate(tokens) if t == image_token_id]
    if len(pads) != len(grids):
        raise ValueError(f"{len(pads)} image placeholders in the tokens but {len(grids)} image grids")
    out: list[int] = []
    start = 0
    for i, (t, h, w) in zip(pads, grids, strict=True):
        out.extend(tokens[start:i])
        out.extend([image_token_id] * (t * h * w // spatial_merge_size**2))
        start = i + 1
    out.extend(tokens[start:])
    return out
