"""Writes per-step metrics to a JSONL file and (optionally) TensorBoard."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def truncate_metrics(path: str | Path, start_step: int) -> int:
    """Keep only the rows of ``path`` (JSONL) whose step is below ``start_step``; returns how many were
    removed.

    A run resumed from a checkpoint of ``start_step`` steps writes those steps' rows again; the rows a killed
    run wrote after its last checkpoint (and a line torn by the kill) would otherwise repeat step numbers.
    Rewritten atomically, so a kill meanwhile leaves the old file.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    kept, removed = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # torn by a kill
            removed += 1
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] < start_step:
            kept.append(line)
        else:
            removed += 1
    if removed:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        os.replace(tmp, path)
    return removed


class MetricsWriter:
    """Appends one JSON object per step to ``<dir>/metrics.jsonl``; mirrors scalars to TensorBoard.

    ``start_step``: the first step this writer will record (a resumed run's); rows and TensorBoard events of
    that step and later, left by an earlier attempt, are removed so that no step number repeats.
    """

    def __init__(
        self, directory: str | Path, tensorboard: bool = True, start_step: int | None = None
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / "metrics.jsonl"
        if start_step is not None:
            truncate_metrics(self.path, start_step)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # imported lazily: it is slow to import

            self._tb = SummaryWriter(log_dir=str(self.directory / "tb"), purge_step=start_step)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Record the metrics of one step (non-finite floats are written as strings in JSON)."""
        row = {"step": step}
        for k, v in metrics.items():
            if isinstance(v, float) and not math.isfinite(v):
                row[k] = str(v)
            else:
                row[k] = v
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)

    def write_histograms(self, step: int, histograms: dict[str, Sequence[float]]) -> None:
        """TensorBoard histograms of one step (name -> values, e.g. every trained token's lag); metrics.jsonl
        holds their bucket counts, which the caller logs with ``write``."""
        if self._tb is None:
            return
        for name, values in histograms.items():
            if len(values):
                self._tb.add_histogram(name, np.asarray(values, dtype=np.float64), step)

    def close(self) -> None:
        """Flush and close the files."""
        self._file.close()
        if self._tb is not None:
            self._tb.close()
