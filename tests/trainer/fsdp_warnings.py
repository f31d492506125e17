"""FSDP2's warning that a sharded module's forward returned a view tensor, recorded inside a learner rank."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

VIEW_WARNING = "returned a view tensor"


@contextlib.contextmanager
def view_warnings() -> Iterator[list[str]]:
    """A list that holds, after the block, the message of every FSDP2 view-output warning raised in it
    (each time, not once per call site)."""
    found: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield found
    found.extend(str(w.message) for w in caught if VIEW_WARNING in str(w.message))
