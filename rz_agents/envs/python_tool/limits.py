"""Resource limits of one sandboxed Python session."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class SandboxLimits:
    """What one session may use. The defaults are the safe ones ``PythonSandbox()`` gets.

    wall_s: wall-clock seconds per call (the host kills the session ``grace_s`` later if the code
        does not stop by itself, e.g. when spinning in C code or blocking signals).
    cpu_s: CPU seconds per call; session_cpu_s: CPU seconds over the session's whole life.
    memory_bytes: address space per process (RLIMIT_AS).
    session_memory_bytes: resident memory of all the session's processes together (checked by the
        host every 0.1 s while a call runs; the session is killed and restarted beyond it).
    processes: processes + threads of the sandbox user (RLIMIT_NPROC, counted per sandbox).
    file_bytes: largest file the code may write (RLIMIT_FSIZE; also caps captured output).
    tmp_bytes: size of the private writable /tmp (tmpfs).
    open_files: RLIMIT_NOFILE.
    output_bytes: stdout/stderr returned per call; beyond it the head and tail are kept.
    """

    wall_s: float = 10.0
    cpu_s: int = 10
    session_cpu_s: int = 3600
    memory_bytes: int = 1 * GiB
    session_memory_bytes: int = 2 * GiB
    processes: int = 64
    file_bytes: int = 32 * MiB
    tmp_bytes: int = 128 * MiB
    open_files: int = 256
    output_bytes: int = 16 * 1024
    grace_s: float = 1.0
    startup_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"SandboxLimits.{f.name} must be a positive number, got {value!r}")
        if self.output_bytes < 64:
            raise ValueError(f"SandboxLimits.output_bytes must be >= 64, got {self.output_bytes}")

    def for_worker(self, **extra: Any) -> dict[str, Any]:
        """The limits as the JSON dict the in-sandbox worker reads."""
        return {**asdict(self), **extra}
