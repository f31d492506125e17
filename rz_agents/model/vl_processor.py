"""Images -> the vision tower's inputs; the chat template's image placeholders -> one token per merged patch.

Preprocessing (resize to a multiple of patch x merge, rescale, normalise, cut into patches in merge-window
order) is transformers' own Qwen2-VL image processor, the one Qwen3-VL's processor uses, on its PIL backend
(no torchvision needed); transformers is imported where it is used.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import torch

from rz_agents.model.qwen3_vl_config import VisionConfig


def preprocess_images(images: Sequence, vision: VisionConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(pixel_values [patches, patch_dim] fp32, image_grid_thw [images, 3]) of PIL images for `vision`.

    Each image is resized (aspect kept) so its sides are multiples of patch_size * spatial_merge_size and its
    area lies in the checkpoint's [min_pixels, max_pixels], then normalised with its mean and std
    (`vision.image_processing`, read from the checkpoint's preprocessor_config.json)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    how = vision.image_processing
    processor = Qwen2VLImageProcessorPil(
        patch_size=vision.patch_size,
        temporal_patch_size=vision.temporal_patch_size,
        merge_size=vision.spatial_merge_size,
        size={"shortest_edge": how.min_pixels, "longest_edge": how.max_pixels},
        image_mean=list(how.image_mean),
        image_std=list(how.image_std),
    )
    out = processor(images=list(images), return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def decode_png(data: bytes):
    """The RGB PIL image of PNG bytes (ValueError naming what came instead)."""
    from PIL import Image

    if not isinstance(data, (bytes, bytearray)) or bytes(data[:8]) != b"\x89PNG\r\n\x1a\n":
        got = type(data).__name__ if not isinstance(data, (bytes, bytearray)) else repr(bytes(data[:8]))
        raise ValueError(f"an image must be PNG bytes, got {got}")
    img = Image.open(io.BytesIO(bytes(data)))
    img.load()
    return img.convert("RGB") if img.mode != "RGB" else img


def png_image_inputs(pngs: Sequence[bytes], vision: VisionConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``preprocess_images`` of PNG bytes (a Trajectory's images): the one function the engine's policy
    (rollout) and the learner both call, so both sides feed the tower the same pixel_values, bit for bit."""
    return preprocess_images([decode_png(b) for b in pngs], vision)


def image_pad_count(image, vision: VisionConfig) -> int:
    """How many ``<|image_pad|>`` tokens ``image`` (PIL) takes: its merged patches after preprocessing."""
    _, grid = preprocess_images([image], vision)
    return int(grid.prod()) // vision.spatial_merge_size**2


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
