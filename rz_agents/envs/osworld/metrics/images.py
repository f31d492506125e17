"""Image metrics (GIMP tasks, screenshots, wallpapers): SSIM structure checks and simple statistics.

``ssim`` is the structural similarity of scikit-image's ``structural_similarity`` defaults
(7x7 uniform window, sample covariance, K1 = 0.01, K2 = 0.03, data range from the dtype, mean
over channels), written with numpy/scipy. Images of different shapes are not similar (0).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from rz_agents.envs.osworld.metrics.libraries import missing, require

WIN = 7


def ssim(a: Any, b: Any) -> float:
    """Mean SSIM of two equally shaped arrays (H x W or H x W x C); ValueError when shapes differ."""
    from scipy.ndimage import uniform_filter

    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape:
        raise ValueError(f"images differ in shape: {x.shape} vs {y.shape}")
    if x.dtype == np.uint8:
        data_range = 255.0
    elif x.dtype == np.uint16:
        data_range = 65535.0
    elif x.dtype == bool:
        data_range = 1.0
    else:
        data_range = float(max(x.max(), y.max()) - min(x.min(), y.min())) or 1.0
    if x.ndim == 3:
        return float(np.mean([ssim(x[..., c], y[..., c]) for c in range(x.shape[2])]))
    if min(x.shape) < WIN:
        raise ValueError(f"image smaller than the {WIN}x{WIN} window")
    x, y = x.astype(np.float64), y.astype(np.float64)
    ux, uy = uniform_filter(x, WIN), uniform_filter(y, WIN)
    uxx, uyy, uxy = uniform_filter(x * x, WIN), uniform_filter(y * y, WIN), uniform_filter(x * y, WIN)
    cov = WIN * WIN / (WIN * WIN - 1)
    vx, vy, vxy = cov * (uxx - ux * ux), cov * (uyy - uy * uy), cov * (uxy - ux * uy)
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux**2 + uy**2 + c1) * (vx + vy + c2))
    pad = (WIN - 1) // 2
    return float(s[pad:-pad, pad:-pad].mean())


def _open(path: str) -> Any:
    from PIL import Image

    return Image.open(path)


def structure_same(img1: Any, img2: Any, threshold: float = 0.9) -> bool:
    """SSIM of two PIL images at least ``threshold`` (different shapes: not the same)."""
    try:
        return ssim(np.array(img1), np.array(img2)) >= threshold
    except ValueError:
        return False


def compare_images(image1: str | None, image2: str | None, **options: Any) -> float:
    """SSIM of the two images in grey, both resized to the smaller size; with ``reference_base_result``
    the score is rescaled so that base (+0.01) maps to 0."""
    if not image1 or not image2:
        return 0.0
    from PIL import Image

    a, b = _open(image1).convert("L"), _open(image2).convert("L")
    size = min(a.size, b.size)
    value = ssim(
        np.array(a.resize(size, Image.Resampling.LANCZOS)), np.array(b.resize(size, Image.Resampling.LANCZOS))
    )
    base = options.get("reference_base_result")
    if base is None:
        return value
    return (value - base) / (1 - base) if value >= base + 0.01 else 0.0


def compare_image_list(pred: str | list[str] | None, gold: str | list[str] | None, **_: Any) -> float:
    """1 when every image equals its gold pixel for pixel."""
    from PIL import ImageChops

    preds, golds = (pred if isinstance(pred, list) else [pred]), (gold if isinstance(gold, list) else [gold])
    for p, g in zip(preds, golds, strict=False):
        if not p or not g:
            return 0.0
        a, b = _open(p), _open(g)
        if a.size != b.size or a.mode != b.mode or ImageChops.difference(a, b).getbbox():
            return 0.0
    return 1.0


def _brightness(img: Any) -> float:
    from PIL import ImageStat

    return ImageStat.Stat(img.convert("L")).mean[0]


def check_brightness_decrease_and_structure_sim(
    src: str | None, tgt: str | None, threshold: float = 0.03, **_: Any
) -> float:
    """1 when ``src`` is darker than ``tgt`` and, both normalised to mean brightness 128, their MSE is below
    ``threshold``."""
    if not src or not tgt:
        return 0.0
    a, b = _open(src), _open(tgt)
    if not _brightness(b) > _brightness(a):
        return 0.0

    def normalised(img: Any) -> np.ndarray:
        factor = 128 / _brightness(img)
        return np.array(img.point(lambda v: min(255, max(0, int(v * factor)))), dtype=np.float32) / 255

    na, nb = normalised(a), normalised(b)
    return float(na.shape == nb.shape and float(np.mean((na - nb) ** 2)) < threshold)


def check_saturation_increase_and_structure_sim(src: str | None, tgt: str | None, **_: Any) -> float:
    """1 when ``src`` is more saturated than ``tgt`` with the same hue and value structure (SSIM >= 0.9)."""
    if not src or not tgt:
        return 0.0
    a, b = _open(src).convert("HSV"), _open(tgt).convert("HSV")
    (h1, s1, v1), (h2, s2, v2) = a.split(), b.split()
    increased = np.mean(np.array(s2)) < np.mean(np.array(s1))
    return float(increased and structure_same(h1, h2) and structure_same(v1, v2))


def check_contrast_increase_and_structure_sim(src: str | None, tgt: str | None, **_: Any) -> float:
    """1 when ``src`` has more contrast (pixel standard deviation) than ``tgt`` and SSIM >= 0.65."""
    if not src or not tgt:
        return 0.0
    a, b = _open(src), _open(tgt)
    higher = np.std(np.asarray(b, dtype=np.float32)) < np.std(np.asarray(a, dtype=np.float32))
    return float(higher and structure_same(a, b, 0.65))


def check_file_exists_and_structure_sim(src: str | None, tgt: str | None, **_: Any) -> float:
    """1 when the exported file exists and looks like ``tgt`` (SSIM >= 0.9)."""
    if not src or not tgt or not os.path.isfile(src):
        return 0.0
    return float(structure_same(_open(src), _open(tgt)))


def check_structure_sim(src: str | None, tgt: str | None, **_: Any) -> float:
    """1 when the two images are structurally similar (SSIM >= 0.9)."""
    if not src or not tgt:
        return 0.0
    return float(structure_same(_open(src), _open(tgt)))


def check_structure_sim_resized(src: str | None, tgt: str | None, **_: Any) -> float:
    """1 when ``src`` resized to ``tgt``'s size is structurally similar (SSIM >= 0.9).

    As OSWorld (8942695): a plain resize of the whole image, modes as they are (an RGBA source
    against an RGB target has another shape and is not similar); no crop to the opaque content.
    """
    if src is None or tgt is None:
        return 0.0
    a, b = _open(src), _open(tgt)
    return float(structure_same(a.resize(b.size), b))


def check_image_mirror(src: str | None, tgt: str | None, **_: Any) -> float:
    """1 when ``tgt`` is ``src`` mirrored left-right (SSIM >= 0.99)."""
    if not src or not tgt:
        return 0.0
    from PIL import Image

    return float(structure_same(_open(src).transpose(Image.Transpose.FLIP_LEFT_RIGHT), _open(tgt), 0.99))


def check_palette_and_structure_sim(src: str | None, tgt: str | None, **_: Any) -> float:
    """1 when ``src`` is a palette (indexed) image that looks like ``tgt``."""
    if not src or not tgt:
        return 0.0
    a = _open(src)
    return float(a.mode == "P" and structure_same(a.convert("RGB"), _open(tgt)))


def check_green_background(src: str | None, tgt: str | None, **_: Any) -> float:
    """1 when every pixel that is not black in ``tgt`` (the background mask) is green in ``src``."""
    if not src or not tgt:
        return 0.0
    a, b = np.array(_open(src).convert("RGB")).astype(int), np.array(_open(tgt).convert("RGB"))
    if a.shape != b.shape:
        return 0.0
    background = np.any(b != 0, axis=2)
    r, g, bl = a[..., 0], a[..., 1], a[..., 2]
    return float(bool(np.all((g > r) & (g > bl) | ~background)))


def check_triangle_position(tgt: str | None, **_: Any) -> float:
    """1 when the centroid of the picked colour's pixels is within 5% (per axis) of the image centre.

    As OSWorld: the image's own channels (RGBA stays RGBA; a one-channel image raises, scored 0),
    colours sorted by pixel count ascending (``np.argsort``) and the one at index 1 picked. Its
    comment says "the triangle, the background being the most common", but index 1 is the second
    *rarest* colour, and with only two colours it is the background itself (whose centroid is central
    for any centred shape). Kept for leaderboard comparability.
    """
    if tgt is None:
        return 0.0
    img = np.array(_open(tgt))
    if img.ndim != 3:
        raise ValueError(f"check_triangle_position: a {img.ndim}-D image has no colour channels")
    colors, counts = np.unique(img.reshape(-1, img.shape[2]), axis=0, return_counts=True)
    if len(colors) < 2:
        raise ValueError("check_triangle_position: the image has a single colour")
    picked = colors[np.argsort(counts)][1]
    coords = np.argwhere(np.all(img == picked, axis=2))
    centre, size = np.array(img.shape[:2]) / 2, np.array(img.shape[:2])
    return float(bool(np.all(np.abs(coords.mean(axis=0) - centre) < 0.05 * size)))


def check_textbox_on_leftside(src: str | None, **_: Any) -> float:
    """1 when the leftmost dark (< 128 grey) pixel lies in the left 5% of the image."""
    if not src:
        return 0.0
    grey = np.array(_open(src).convert("L"))
    dark = np.argwhere(grey < 128)
    return float(len(dark) > 0 and dark[:, 1].min() < grey.shape[1] * 0.05)


def check_image_size(src: str | None, rule: dict[str, Any], **_: Any) -> float:
    """1 when the image (its opaque content, with ``ignore_transparent``) has ``rule``'s width/height."""
    if not src:
        return 0.0
    img = _open(src)
    width, height = img.size
    if (rule.get("ignore_transparent", False) and img.mode in ("RGBA", "LA")) or "transparency" in img.info:
        box = img.convert("RGBA").split()[-1].getbbox()
        width, height = (box[2] - box[0], box[3] - box[1]) if box else (0, 0)
    return float(rule.get("height") in (None, height) and rule.get("width") in (None, width))


def check_image_file_size(src_path: str | None, rule: dict[str, Any], **_: Any) -> float:
    """1 when the file is smaller than ``rule["max_size"]`` bytes."""
    if src_path is None:
        return 0.0
    return float(os.path.getsize(src_path) < rule["max_size"])


_OPENCV = missing(("cv2", "opencv-python-headless"))


def laplacian_variance(path: str) -> float:
    """OSWorld's ``calculate_image_sharpness``: the variance of OpenCV's Laplacian (``CV_64F``) of
    the image read in grey (``cv2.imread(path, IMREAD_GRAYSCALE)``)."""
    require(_OPENCV, "check_sharper")
    import cv2

    return float(np.var(cv2.Laplacian(cv2.imread(path, cv2.IMREAD_GRAYSCALE), cv2.CV_64F)))


def check_sharper(src_path: str, tgt_path: str, **_: Any) -> float:
    """1 when the first image's Laplacian variance (sharpness) is above the second's."""
    return float(laplacian_variance(src_path) > laplacian_variance(tgt_path))


BLOCKERS: dict[str, Callable[[], str | None]] = {"check_sharper": _OPENCV}

METRICS: dict[str, Callable[..., float]] = {
    "compare_images": compare_images,
    "compare_image_list": compare_image_list,
    "check_brightness_decrease_and_structure_sim": check_brightness_decrease_and_structure_sim,
    "check_saturation_increase_and_structure_sim": check_saturation_increase_and_structure_sim,
    "check_contrast_increase_and_structure_sim": check_contrast_increase_and_structure_sim,
    "check_file_exists_and_structure_sim": check_file_exists_and_structure_sim,
    "check_structure_sim": check_structure_sim,
    "check_structure_sim_resized": check_structure_sim_resized,
    "check_image_mirror": check_image_mirror,
    "check_palette_and_structure_sim": check_palette_and_structure_sim,
    "check_green_background": check_green_background,
    "check_triangle_position": check_triangle_position,
    "check_image_file_size": check_image_file_size,
    "check_sharper": check_sharper,
    "check_textbox_on_leftside": check_textbox_on_leftside,
    "check_image_size": check_image_size,
}
