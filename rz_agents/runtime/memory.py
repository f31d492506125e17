"""Process memory: the resident set size, and glibc heap settings that stop it creeping up.

A run allocates tensors of a different size every step (batches have different token counts) from
several threads (engine, learner, env pool). With glibc's defaults, freed blocks stay in per-thread
arenas and the dynamic mmap threshold rises, so the resident set grows step after step although the
live tensors do not. ``limit_heap_growth`` fixes the mmap threshold (large tensors are mapped and
unmapped, so their pages go back to the system at free) and caps the arenas; ``trim_heap`` returns
freed heap pages after each learner step. Both are no-ops where glibc is not the C library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt  # noqa: B018 - glibc only; AttributeError elsewhere
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def limit_heap_growth(mmap_threshold: int = 16 << 20, arena_max: int = 4) -> bool:
    """Allocations >= ``mmap_threshold`` bytes go to mmap (returned at free); at most ``arena_max``
    malloc arenas. Returns False where it cannot be applied."""
    libc = _libc()
    if libc is None:
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, int(mmap_threshold)) == 1
    ok &= libc.mallopt(M_TRIM_THRESHOLD, int(2 * mmap_threshold)) == 1
    ok &= libc.mallopt(M_ARENA_MAX, int(arena_max)) == 1
    return bool(ok)


def trim_heap() -> None:
    """Give freed heap pages back to the system (glibc ``malloc_trim``)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def rss_bytes() -> int:
    """Resident set size of this process (0 where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
