"""Writes per-step metrics to a JSONL file and (optionally) TensorBoard."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class MetricsWriter:
    """Appends one JSON object per step to ``<dir>/metrics.jsonl``; mirrors scalars to TensorBoard."""

    def __init__(self, directory: str | Path, tensorboard: bool = True) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / "metrics.jsonl"
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # imported lazily: it is slow to import

            self._tb = SummaryWriter(log_dir=str(self.directory / "tb"))

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

    def close(self) -> None:
        """Flush and close the files."""
        self._file.close()
        if self._tb is not None:
            self._tb.close()
