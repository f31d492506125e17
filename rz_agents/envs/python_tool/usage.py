"""Memory and process count of a whole process tree, read from /proc.

RLIMIT_AS bounds each process, not their sum: 64 processes of 1 GiB each would take the machine
down. Without a cgroup of its own (not available everywhere), the host enforces a per-session
total by summing the resident memory of the sandbox's process tree while a call runs.
"""

from __future__ import annotations

import os

PAGE = os.sysconf("SC_PAGE_SIZE")


def tree_usage(root: int) -> tuple[int, int]:
    """``(processes, resident bytes)`` of ``root`` and all its descendants (0, 0 if gone)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # fields after the parenthesised command: state ppid ... (rss is field 24 overall)
        fields = stat[stat.rindex(b")") + 2 :].split()
        pid = int(name)
        children.setdefault(int(fields[1]), []).append(pid)
        rss[pid] = int(fields[21]) * PAGE
    if root not in rss:
        return 0, 0
    count, total, stack = 0, 0, [root]
    while stack:
        pid = stack.pop()
        count += 1
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, ()))
    return count, total
