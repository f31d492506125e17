"""Bar charts to read a value off: deterministic by (split, index), like the button pictures.

A chart is ``n_bars`` coloured bars (distinct ``PALETTE`` colours) standing on a baseline, each
of an integer value in ``1..max_value``, with a tick on the left edge at every unit: a bar of value
``v`` is ``v * unit`` pixels tall, ``unit = (size - 8) // max_value``. Train and test draw from
separate streams (a split code of their own, distinct from the button pictures').
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rz_agents.envs.visual_click.render import BACKGROUND, INK, PALETTE, SPLITS

MARGIN = 4  # pixels between the plot and the picture's edges
CHART_STREAM = 100  # added to the split code: charts never share a stream with button pictures


@dataclass(frozen=True)
class Chart:
    """A chart's side in pixels, its bars (colour, value) left to right, and which bar is asked for."""

    size: int
    max_value: int
    bars: tuple[tuple[str, int], ...]
    target: int

    @property
    def unit(self) -> int:
        """Pixels per unit of value."""
        return unit_of(self.size, self.max_value)

    @property
    def answer(self) -> int:
        """The asked bar's value."""
        return self.bars[self.target][1]


def unit_of(size: int, max_value: int) -> int:
    """Pixels per unit of value in a ``size`` chart whose bars reach ``max_value``."""
    return (size - 2 * MARGIN) // max_value


def check_chart(size: int, n_bars: int, max_value: int) -> None:
    """ValueError naming the bad setting."""
    if not isinstance(size, int) or not 32 <= size <= 512:
        raise ValueError(f"image_size must be an int in [32, 512], got {size!r}")
    if not isinstance(n_bars, int) or not 1 <= n_bars <= len(PALETTE):
        raise ValueError(f"n_bars must be an int in [1, {len(PALETTE)}], got {n_bars!r}")
    if not isinstance(max_value, int) or max_value < 2 or unit_of(size, max_value) < 2:
        raise ValueError(f"max_value must be an int >= 2 with >= 2 pixels a unit, got {max_value!r}")
    if (size - 2 * MARGIN) // n_bars < 4:
        raise ValueError(f"{n_bars} bars do not fit a {size}-pixel chart")


def make_chart(split: str, index: int, size: int = 64, n_bars: int = 4, max_value: int = 9) -> Chart:
    """The chart of task ``index`` of ``split``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    check_chart(size, n_bars, max_value)
    seed = np.random.SeedSequence([CHART_STREAM + SPLITS[split], int(index), size, n_bars, max_value])
    rng = np.random.default_rng(seed)
    colors = rng.choice(list(PALETTE), size=n_bars, replace=False)
    values = rng.integers(1, max_value + 1, size=n_bars)
    bars = tuple((str(c), int(v)) for c, v in zip(colors, values, strict=True))
    return Chart(size, max_value, bars, int(rng.integers(n_bars)))


def render_chart(chart: Chart) -> np.ndarray:
    """The chart as an ``HxWx3 uint8`` array: ticks on the left, the bars on the baseline."""
    s, unit = chart.size, chart.unit
    pixels = np.empty((s, s, 3), dtype=np.uint8)
    pixels[:] = BACKGROUND
    base = s - MARGIN  # the baseline row (bars end just above it)
    pixels[base, MARGIN : s - MARGIN] = INK
    for v in range(chart.max_value + 1):
        pixels[base - v * unit, 0 : MARGIN - 1] = INK
    slot = (s - 2 * MARGIN) // len(chart.bars)
    for k, (color, value) in enumerate(chart.bars):
        x0 = MARGIN + k * slot + 1
        pixels[base - value * unit : base, x0 : x0 + slot - 2] = PALETTE[color]
    return pixels
