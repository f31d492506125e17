"""A run's ``env.tasks`` / ``env.eval_tasks``: a list of task mappings, a file of them, or a packaged set.

* a list: each item a mapping (``{word: apple}``), given to ``env.reset(options={"task": ...})`` as is;
* a path to a ``.jsonl`` (one JSON object a line), ``.json`` (a list of objects) or ``.parquet`` file
  (needs pyarrow), relative to the working directory; records are given to the env as they are;
* a packaged dataset's name (``gsm8k``, ``math_numeric_3k``, ``word_problems``, ...: rz_agents.data),
  as ``{"id", "question", "answer"}`` records.

Every problem is one ValueError line naming the field and the index of the bad task.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def _packaged_names() -> list[str]:
    from rz_agents.data.loader import ALIASES, DATASETS

    return [*DATASETS, *ALIASES, "word_problems"]


def _check_items(items: list[Any], where: str) -> list[dict[str, Any]]:
    for i, task in enumerate(items):
        if not isinstance(task, dict):
            raise ValueError(
                f"{where}[{i}]: a task must be a mapping of the env's task fields (e.g. {{id: t1, word: "
                f"apple}}), got {type(task).__name__} {task!r:.80}"
            )
    if not items:
        raise ValueError(f"{where}: no task (an empty list); leave it out to let the env draw its own")
    return items


def load_tasks(value: list[Any] | str | None, where: str = "env.tasks") -> list[dict[str, Any]] | None:
    """The task list ``value`` gives (None: the env draws its own); ValueError with one line naming
    ``where`` and the culprit (the file, the index of a task that is not a mapping)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return _check_items(list(value), where)
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a list of tasks, a file path or a packaged name, got {value!r}")
    from rz_agents.data.loader import DatasetError, load_dataset, read_records

    path = Path(value).expanduser()
    try:
        if path.is_file():
            if path.suffix.lower() not in FILE_SUFFIXES:
                raise ValueError(f"{where}: {value}: tasks are read from {', '.join(FILE_SUFFIXES)} files")
            return _check_items(read_records(path), f"{where} ({value}) task")
        if path.suffix.lower() in FILE_SUFFIXES or "/" in value:
            raise ValueError(f"{where}: {value}: no such file (relative paths start at {Path.cwd()})")
        if value in _packaged_names():
            return load_dataset(value)
    except DatasetError as exc:
        raise ValueError(f"{where}: {exc}") from None
    close = difflib.get_close_matches(value, _packaged_names(), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ValueError(
        f"{where}: {value!r} is neither a file nor a packaged task set ({hint}packaged: "
        f"{', '.join(_packaged_names())}); a list of tasks is written [{{id: t1, ...}}, ...]"
    )


def check_tasks(value: list[Any] | str | None, where: str = "env.tasks") -> None:
    """Raise ValueError as ``load_tasks`` would (the file is read: a bad record fails at config load)."""
    load_tasks(value, where)
