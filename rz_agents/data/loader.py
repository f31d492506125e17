"""``load_dataset``: named packaged sets or user JSONL/JSON/parquet
files -> ``{"id", "question", "answer"}``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MATH_DIR = Path(__file__).with_name("math")


class DatasetError(ValueError):
    """A dataset could not be loaded; the message names the file, record and field."""


@dataclass(frozen=True)
class PackagedSet:
    """A packaged file and which of its fields hold the question and the answer."""

    filename: str
    question: str
    answer: str


DATASETS: dict[str, PackagedSet] = {
    "aime24": PackagedSet("aime24.jsonl", "question", "answer"),
    "aime25": PackagedSet("aime25.jsonl", "question", "answer"),
    "aime26": PackagedSet("aime26.jsonl", "question", "answer"),
    "amc23": PackagedSet("amc23.jsonl", "question", "ground_truth"),
    "math500": PackagedSet("math500.jsonl", "problem", "answer"),
    "gsm8k": PackagedSet("gsm8k_test.jsonl", "question", "ground_truth"),
    "math_numeric_3k": PackagedSet("math_numeric_3k.jsonl", "question", "ground_truth"),
}
ALIASES = {"aime2024": "aime24", "aime2025": "aime25", "aime2026": "aime26", "gsm8k_test": "gsm8k"}


def read_records(path: Path) -> list[Any]:
    """The records of a ``.jsonl`` (one JSON value a line), ``.json`` (a list) or ``.parquet`` file, as is;
    DatasetError naming the file (and line) when it cannot be read."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DatasetError(
                f"{path}: reading parquet needs pyarrow, which is not installed (pip install pyarrow), "
                "or convert the file to JSONL"
            ) from None
        return pq.read_table(path).to_pylist()
    text = path.read_text(encoding="utf-8")
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}: invalid JSON: {exc}") from None
        if not isinstance(data, list):
            raise DatasetError(f"{path}: a .json dataset must be a list of objects")
        return data
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{lineno}: invalid JSON: {exc.msg}") from None
    return records


def _normalize(records: list[Any], source: str, prefix: str, fields: dict[str, str]) -> list[dict[str, str]]:
    out = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise DatasetError(f"{source}: record {i} is not an object")
        row = {}
        for key in ("question", "answer"):
            value = rec.get(fields[key])
            if value is None or (isinstance(value, str) and not value.strip()):
                raise DatasetError(
                    f"{source}: record {i} has no {fields[key]!r} field for {key!r} "
                    f"(fields: {', '.join(map(str, rec))}); pass field_map={{{key!r}: '<field>'}}"
                )
            row[key] = str(value).strip() if key == "answer" else str(value)
        raw_id = rec.get(fields["id"])
        row = {"id": str(raw_id) if raw_id is not None else f"{prefix}-{i}", **row}
        out.append(row)
    return out


# The generated evaluation set: training draws word problems from per-episode seeds (another stream).
WORD_PROBLEMS_HELDOUT = 200
WORD_PROBLEMS_SEED = 7919


def load_dataset(
    name_or_path: str | Path, field_map: dict[str, str] | None = None, limit: int | None = None
) -> list[dict[str, str]]:
    """Load a dataset as a list of ``{"id", "question", "answer"}`` dicts.

    ``name_or_path``: a packaged name (``aime24``, ``aime25``, ``aime26``, ``amc23``, ``math500``,
    ``gsm8k``, ``math_numeric_3k``), ``word_problems`` (the held-out set of the GSM8K-style template
    generator: ``WORD_PROBLEMS_HELDOUT`` problems of seed ``WORD_PROBLEMS_SEED``) or a
    ``.jsonl`` / ``.json`` / ``.parquet`` file (parquet needs pyarrow). ``field_map`` maps our keys to the
    file's field names, e.g. ``{"question": "prompt", "answer": "target"}``; records without an id get
    ``<name>-<index>``.
    """
    key = str(name_or_path)
    key = ALIASES.get(key, key)
    if key == "word_problems":
        from rz_agents.data.word_problems import generate_word_problems

        tasks = generate_word_problems(WORD_PROBLEMS_HELDOUT, seed=WORD_PROBLEMS_SEED)
        return tasks[:limit] if limit is not None else tasks
    if key in DATASETS:
        spec = DATASETS[key]
        fields = {"id": "id", "question": spec.question, "answer": spec.answer, **(field_map or {})}
        path, prefix = MATH_DIR / spec.filename, key
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise DatasetError(
                f"unknown dataset {key!r}: not a packaged name ({', '.join(DATASETS)}) and no such file"
            )
        fields = {"id": "id", "question": "question", "answer": "answer", **(field_map or {})}
        prefix = path.stem
    unknown = set(field_map or {}) - {"id", "question", "answer"}
    if unknown:
        raise DatasetError(f"field_map keys must be among id, question, answer; got {sorted(unknown)}")
    records = read_records(path)
    if limit is not None:
        records = records[:limit]
    return _normalize(records, str(path), prefix, fields)
