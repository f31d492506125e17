"""``compare_archive``: unpack two archives and score their files pairwise with another metric.

OSWorld's ``metrics/chrome.py``: both archives are unpacked (``shutil.unpack_archive``), the
sorted names under ``file_path`` must be equal, and the score is the mean of ``file_type``'s
metric (``text``, ``pdf``, ``docx``, ``ppt``, ``image``, ``csv``, ``table``, ``audio``, ``video``)
over the pairs; the other options go to that metric.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from rz_agents.envs.osworld.metrics.docs import compare_docx_files
from rz_agents.envs.osworld.metrics.general import compare_text_file
from rz_agents.envs.osworld.metrics.images import compare_images
from rz_agents.envs.osworld.metrics.media import compare_audios, compare_videos
from rz_agents.envs.osworld.metrics.pdf import compare_pdfs
from rz_agents.envs.osworld.metrics.slides import compare_pptx_files
from rz_agents.envs.osworld.metrics.table import compare_csv, compare_table

# the metric of each file type (its own module's function, not the package's table: no import cycle)
FILE_TYPES: dict[str, Callable[..., float]] = {
    "text": compare_text_file,
    "pdf": compare_pdfs,
    "docx": compare_docx_files,
    "ppt": compare_pptx_files,
    "image": compare_images,
    "csv": compare_csv,
    "table": compare_table,
    "audio": compare_audios,
    "video": compare_videos,
}


def _unpack(path: str, into: str) -> None:
    kwargs: dict[str, Any] = {}
    if not path.lower().endswith(".zip"):
        kwargs["filter"] = "data"  # tar members may not escape the folder
    shutil.unpack_archive(path, into, **kwargs)


def compare_archive(pred_path: str | None, gold_path: str, **options: Any) -> float:
    """Mean per-file score of ``file_type``'s metric; 0 when the listed names differ."""
    if not pred_path:
        return 0.0
    file_path = options.pop("file_path", "")
    file_type = options.pop("file_type", "text")
    if file_type not in FILE_TYPES:
        raise ValueError(f"compare_archive: file type {file_type!r} not supported")
    with tempfile.TemporaryDirectory(prefix="rz_archive_") as tmp:
        pred, gold = os.path.join(tmp, "pred"), os.path.join(tmp, "gold")
        _unpack(pred_path, pred)
        _unpack(gold_path, gold)
        pred_files = sorted(os.listdir(os.path.join(pred, file_path)))
        gold_files = sorted(os.listdir(os.path.join(gold, file_path)))
        if pred_files != gold_files:
            return 0.0
        metric = FILE_TYPES[file_type]
        total = sum(
            float(metric(os.path.join(pred, file_path, f1), os.path.join(gold, file_path, f2), **options))
            for f1, f2 in zip(pred_files, gold_files, strict=True)
        )
        return total / len(pred_files)  # two empty folders divide by zero, as in OSWorld (scored 0)


METRICS: dict[str, Callable[..., float]] = {"compare_archive": compare_archive}
