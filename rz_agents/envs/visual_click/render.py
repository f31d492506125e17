"""Layouts of labelled coloured buttons and their pictures, deterministic by (split, index).

A layout is ``n`` non-overlapping rectangles on a grey square, each a distinct colour from
``PALETTE`` with a distinct digit label (1-9) drawn in black in a built-in 3x5 pixel font (no font
file: the same pixels on every machine), and one of them the target. Pixel ``(x, y)`` covers
``[x, x+1) x [y, y+1)``; a button covers ``x0 <= x < x1, y0 <= y < y1``.

The layout of ``(split, index)`` comes from ``numpy.random.SeedSequence([split code, index, size,
n])``: the ``train`` and ``test`` splits draw from separate streams, so no test layout is a train
layout (tested), and the same pair gives the same picture anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

# Named colours, far apart in RGB so that a tiny model (and the oracle) tells them apart.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (50, 80, 230),
    "yellow": (235, 210, 40),
    "purple": (150, 60, 200),
    "orange": (245, 140, 30),
    "cyan": (40, 200, 210),
    "pink": (240, 130, 200),
}
BACKGROUND = (110, 110, 110)
INK = (0, 0, 0)
SPLITS = {"train": 0, "test": 1}
LABELS = "123456789"

# 3x5 digits, one string of 15 pixels per digit, row by row ("#" = ink)
_GLYPHS = {
    "1": ".#.##..#..#.###",
    "2": "###..#####..###",
    "3": "###..####..####",
    "4": "#.##.####..#..#",
    "5": "####..###..####",
    "6": "####..####.####",
    "7": "###..#..#..#..#",
    "8": "####.#####.####",
    "9": "####.####..####",
}
GLYPH_W, GLYPH_H = 3, 5


@dataclass(frozen=True)
class Button:
    """One button: its box (``x1``, ``y1`` exclusive), colour name and label."""

    x0: int
    y0: int
    x1: int
    y1: int
    color: str
    label: str

    def contains(self, x: float, y: float) -> bool:
        """True when the point ``(x, y)`` (image pixels) is on the button."""
        return self.x0 <= x < self.x1 and self.y0 <= y < self.y1

    @property
    def area(self) -> int:
        """Its area in pixels."""
        return (self.x1 - self.x0) * (self.y1 - self.y0)

    @property
    def centre(self) -> tuple[int, int]:
        """Its central pixel."""
        return (self.x0 + self.x1 - 1) // 2, (self.y0 + self.y1 - 1) // 2


@dataclass(frozen=True)
class Layout:
    """A picture's buttons, the image's side in pixels, and which button the instruction names."""

    size: int
    buttons: tuple[Button, ...]
    target: int

    @property
    def target_button(self) -> Button:
        """The named button."""
        return self.buttons[self.target]

    @property
    def chance(self) -> float:
        """The hit rate of a click at a uniformly random pixel: the target's share of the image."""
        return self.target_button.area / (self.size * self.size)


def glyph_scale(size: int) -> int:
    """How many pixels a font pixel takes: 1 below 96-pixel images, 2 below 192, and so on."""
    return 1 + size // 96


ARRANGEMENTS = ("random", "columns")


def make_layout(
    split: str, index: int, size: int = 64, n_buttons: int = 3, arrangement: str = "random"
) -> Layout:
    """The layout of task ``index`` of ``split`` (ValueError naming a bad argument).

    ``arrangement``: ``random`` (boxes of random size anywhere, not overlapping) or ``columns`` (button i
    centred in the i-th of ``n_buttons`` equal columns, at mid-height, of random size: where buttons are
    is fixed, which colour and label sit where is not; the easy setting for a tiny policy)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if not isinstance(index, (int, np.integer)) or index < 0:
        raise ValueError(f"index must be an int >= 0, got {index!r}")
    if arrangement not in ARRANGEMENTS:
        raise ValueError(f"arrangement must be one of {', '.join(ARRANGEMENTS)}, got {arrangement!r}")
    check_size(size, n_buttons)
    key = [SPLITS[split], int(index), size, n_buttons] + ([1] if arrangement == "columns" else [])
    rng = np.random.default_rng(np.random.SeedSequence(key))
    g = glyph_scale(size)
    min_w, min_h = GLYPH_W * g + 4 * g, GLYPH_H * g + 4 * g
    boxes: list[tuple[int, int, int, int]] = []
    if arrangement == "columns":
        col = size // n_buttons
        if col - 4 < min_w:
            raise ValueError(f"{n_buttons} columns do not fit a {size}x{size} image: use fewer buttons")
        for i in range(n_buttons):
            w = int(rng.integers(min_w, max(min_w, col * 3 // 4) + 1))
            h = int(rng.integers(max(min_h, size // 7), max(min_h, size // 3) + 1))
            cx, cy = i * col + col // 2, size // 2
            boxes.append((cx - w // 2, cy - h // 2, cx - w // 2 + w, cy - h // 2 + h))
    for _ in range(1000 if arrangement == "random" else 0):
        if len(boxes) == n_buttons:
            break
        w = int(rng.integers(max(min_w, size // 5), max(min_w, size * 3 // 10) + 1))
        h = int(rng.integers(max(min_h, size // 7), max(min_h, size // 4) + 1))
        x0, y0 = int(rng.integers(1, size - w)), int(rng.integers(1, size - h))
        box = (x0, y0, x0 + w, y0 + h)
        gap = 2  # pixels of background between buttons
        if all(
            box[0] >= b[2] + gap or b[0] >= box[2] + gap or box[1] >= b[3] + gap or b[1] >= box[3] + gap
            for b in boxes
        ):
            boxes.append(box)
    if len(boxes) < n_buttons:
        raise ValueError(f"{n_buttons} buttons do not fit a {size}x{size} image; use fewer or a larger size")
    colors = rng.choice(list(PALETTE), size=n_buttons, replace=False)
    labels = rng.choice(list(LABELS), size=n_buttons, replace=False)
    buttons = tuple(Button(*b, str(c), str(lab)) for b, c, lab in zip(boxes, colors, labels, strict=True))
    return Layout(size, buttons, int(rng.integers(n_buttons)))


def with_target_color(layout: Layout, color: str) -> Layout:
    """``layout`` with its target painted ``color`` (a button that had that colour takes the target's old
    one), everything else unchanged: the named colour is always ``color``, where it sits still varies."""
    if color not in PALETTE:
        raise ValueError(f"target_color must be one of {', '.join(PALETTE)}, got {color!r}")
    old = layout.target_button.color
    swap = {color: old, old: color}
    buttons = tuple(replace(b, color=swap.get(b.color, b.color)) for b in layout.buttons)
    return replace(layout, buttons=buttons)


def check_size(size: int, n_buttons: int) -> None:
    """ValueError naming ``size`` or ``n_buttons`` when out of range."""
    if not isinstance(size, int) or not 32 <= size <= 512:
        raise ValueError(f"image_size must be an int in [32, 512], got {size!r}")
    if not isinstance(n_buttons, int) or not 1 <= n_buttons <= len(PALETTE):
        raise ValueError(f"n_buttons must be an int in [1, {len(PALETTE)}], got {n_buttons!r}")


def draw_button(pixels: np.ndarray, button: Button, scale: int) -> None:
    """Paint ``button`` (its colour, its label centred in black) into ``pixels`` (HxWx3 uint8)."""
    pixels[button.y0 : button.y1, button.x0 : button.x1] = PALETTE[button.color]
    gw, gh = GLYPH_W * scale, GLYPH_H * scale
    left = button.x0 + (button.x1 - button.x0 - gw) // 2
    top = button.y0 + (button.y1 - button.y0 - gh) // 2
    glyph = _GLYPHS[button.label]
    for k, ch in enumerate(glyph):
        if ch == "#":
            r, c = divmod(k, GLYPH_W)
            pixels[top + r * scale : top + (r + 1) * scale, left + c * scale : left + (c + 1) * scale] = INK


def render(layout: Layout) -> np.ndarray:
    """The layout's picture as an ``HxWx3 uint8`` array."""
    pixels = np.empty((layout.size, layout.size, 3), dtype=np.uint8)
    pixels[:] = BACKGROUND
    for b in layout.buttons:
        draw_button(pixels, b, glyph_scale(layout.size))
    return pixels
