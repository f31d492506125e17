"""The libraries OSWorld's own metrics compute with, where a port calls them rather than rewriting
them: PyMuPDF (PDF text and pages), PyPDF2 (PDFs in archives), OpenCV (grey images, Laplacian,
video frames), ImageHash (perceptual hashes), librosa and fastdtw (audio). They come with the
``osworld`` extra; without one, ``validate`` names it as the task's blocker and the metric raises."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable


def missing(*modules: tuple[str, str]) -> Callable[[], str | None]:
    """A blocker check: the first ``(module, pip name)`` that cannot be imported, said as a reason."""

    def check() -> str | None:
        for module, package in modules:
            if importlib.util.find_spec(module) is None:
                return f"needs {package} (pip install {package}; the osworld extra has it)"
        return None

    return check


def require(check: Callable[[], str | None], metric: str) -> None:
    """Raise with the reason when ``check`` names a missing library."""
    problem = check()
    if problem:
        raise RuntimeError(f"{metric}: {problem}")
