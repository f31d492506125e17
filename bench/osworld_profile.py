"""Where one OSWorld desktop's CPU goes: CPU seconds per operation, by process kind.

    python bench/osworld.py --profile [--domains chrome] [--profile-repeats 10] [--json]

One desktop (the first of ``--domains``, warm reset) is started, then each operation runs
``--profile-repeats`` times while a sampler thread reads ``/proc/PID/stat`` of every process of
the desktop (its uid and its process tree) and of the host side (this process and its children:
Playwright's driver) every 50 ms. CPU of a process is its own ``utime + stime`` between its first
and last sample; a child that exits between samples is still counted, through the ``cutime +
cstime`` its parent gains when it reaps it (less what the child's own samples already counted).
The machine may be shared: these are CPU seconds of the desktop's own processes, not wall time.

Operations: ``idle`` (one second of nothing), ``action`` (``/execute`` of one pyautogui line, no
observation), ``tree`` (``/accessibility`` in the env's ``a11y_view``), ``screenshot`` (``/screenshot``),
``step`` (``DesktopEnv.step`` with the observation the env was built with) and ``reset`` (a warm reset in
place plus the task's setup).
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable

CLK = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.05


def process_kind(pid: int) -> str:
    """A short name for what process ``pid`` is (``chromium-renderer``, ``Xvfb``, ``atspi-helper``, ...)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            # split on spaces too: Chromium's children retitle themselves as one space-joined string
            args = f.read().replace(b"\0", b" ").decode(errors="replace").split()
    except OSError:
        return "gone"
    joined = " ".join(args)
    if comm.startswith("chrom"):  # a renderer may retitle itself: its comm stays
        if "crashpad" in comm:
            return "chromium-crashpad"
        kind = next((a.split("=", 1)[1] for a in args if a.startswith("--type=")), "browser")
        if kind == "utility":
            sub = next((a.split("=", 1)[1] for a in args if a.startswith("--utility-sub-type=")), "")
            kind += "-" + sub.split(".")[0] if sub else ""
        if kind == "renderer" and "--top-chrome-webui" in args:
            kind += "-webui"
        return f"chromium-{kind}"
    if comm.startswith("python"):
        for name, kind in (
            ("atspi_tree.py", "atspi-helper (pyatspi walk)"),
            ("action_runner", "action-runner (pyautogui)"),
            ("osworld.session", "session+server (python)"),
        ):
            if name in joined:
                return kind
        return "host: bench (client, relays)" if pid == os.getpid() else "python-other"
    if comm == "dbus-daemon":
        return "dbus-a11y-bus" if "accessibility.conf" in joined else "dbus-session"
    if comm.startswith("at-spi"):
        return "at-spi-" + ("registryd" if "registr" in comm else "launcher")
    if comm == "node" or "playwright" in joined:
        return "host: playwright driver"
    return comm


def _times(pid: int) -> tuple[int, int, int, str] | None:
    """(own ticks, reaped children's ticks, parent pid, comm) of ``pid``, or None when gone.

    For this process, its own ticks leave out the sampler thread's (``/proc/self/task``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            head, tail = f.read().rsplit(")", 1)
        fields = tail.split()
        own, children = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
        if pid == os.getpid():
            own -= round(_SAMPLERS_DONE_TICKS[0])
            for tid in list(_SAMPLER_TIDS):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    t = f.read().rsplit(")", 1)[1].split()
                own -= int(t[11]) + int(t[12])
        return own, children, int(fields[1]), head.partition("(")[2]
    except (OSError, IndexError, ValueError):
        return None


_SAMPLER_TIDS: set[int] = set()  # live sampler threads of this process, left out of its CPU
_SAMPLERS_DONE_TICKS = [0.0]  # and the CPU of those that finished


class CpuSampler:
    """Samples the CPU ticks of a moving set of processes until stopped; ``by_kind`` sums them."""

    def __init__(self, list_pids: Callable[[], list[int]], interval_s: float = SAMPLE_S) -> None:
        # interval_s: a longer one reads /proc less often (many desktops) and misses nothing: a process
        # never sampled is counted whole in its reaper's children's ticks
        self.list_pids = list_pids
        self.interval_s = interval_s
        self.first: dict[int, tuple[int, int]] = {}  # pid -> (own, children) at its first sample
        self.last: dict[int, tuple[int, int, int]] = {}  # pid -> (own, children, ppid) at its last
        self.kind: dict[int, str] = {}
        self.comm: dict[int, str] = {}
        self.alive: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._baseline_pids: set[int] = set()

    def sample(self, initial: bool = False) -> None:
        """One reading of every listed process."""
        pids = set(self.list_pids())
        seen = set()
        for pid in pids:
            t = _times(pid)
            if t is None:
                continue
            seen.add(pid)
            if pid not in self.first:
                # a process already running at the start counts from now; a new one from zero
                self.first[pid] = (t[0], t[1]) if initial or pid in self._baseline_pids else (0, 0)
            if pid not in self.comm or self.comm[pid] != t[3]:
                self.kind[pid] = process_kind(pid)  # again after an exec (sh -> chromium)
                self.comm[pid] = t[3]
            self.last[pid] = t[:3]
        self.alive = seen

    def _run(self) -> None:
        tid = threading.get_native_id()
        _SAMPLER_TIDS.add(tid)
        try:
            while not self._stop.wait(self.interval_s):
                self.sample()
        finally:
            _SAMPLERS_DONE_TICKS[0] += time.thread_time() * CLK
            _SAMPLER_TIDS.discard(tid)

    def __enter__(self) -> CpuSampler:
        self._baseline_pids = set(self.list_pids())
        self.sample(initial=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def by_kind(self) -> dict[str, float]:
        """CPU seconds per process kind over the sampled interval (a process's kind: at its last sample).

        An exited process was reaped by its parent, or by the sandbox's init (the nearest ``bwrap``
        above it) when its parent exited too; the reaper's ``cutime`` gain holds the child's whole
        life, of which the child's own samples already counted the part in this interval."""
        out: dict[str, float] = defaultdict(float)
        for pid, (own0, child0) in self.first.items():
            own1, child1, _ = self.last[pid]
            out[self.kind[pid]] += (own1 - own0 + child1 - child0) / CLK
        for pid, (own1, child1, ppid) in self.last.items():
            if pid in self.alive:
                continue
            reaper = ppid
            while reaper in self.last and reaper not in self.alive:
                reaper = self.last[reaper][2]
            if reaper != ppid:  # the parent exited: the nearest bwrap above (the sandbox's init)
                chain, up = [], ppid
                while up in self.last and up not in chain:
                    chain.append(up)
                    up = self.last[up][2]
                reaper = next((p for p in chain if self.kind.get(p) == "bwrap" and p in self.alive), reaper)
            if reaper in self.last:
                out[self.kind[reaper]] -= (own1 + child1) / CLK
        return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.0005}


def host_pids() -> list[int]:
    """This process and its live descendants: Playwright's driver and every desktop it started
    (bubblewrap's children; orphans inside a sandbox are adopted by its init, a descendant too)."""
    from rz_agents.envs.osworld.providers.local import process_tree

    return process_tree([os.getpid()])


def profile_ops(env, task: dict, repeats: int) -> dict[str, dict]:
    """CPU seconds per operation (mean over ``repeats``) by process kind, plus wall time."""
    from rz_agents.envs.osworld.client import VMClient

    env.reset(task)  # first start: the fresh desktop and its baseline
    env.reset(task)  # and one warm reset, so every helper (tree, runner) is up
    client: VMClient = env.ctx.client

    ops: dict[str, Callable[[int], object]] = {
        "idle": lambda i: time.sleep(1.0),
        "action": lambda i: client.run_python(f"pyautogui.moveTo({100 + 10 * i}, 200)"),
        "tree": lambda i: client.accessibility_tree(env.a11y_view),
        "screenshot": lambda i: client.screenshot(),
        "step": lambda i: env.step(f"pyautogui.moveTo({100 + 10 * i}, 300)", pause=0.0),
        "reset": lambda i: env.reset(task),
    }
    out = {}
    for name, op in ops.items():
        n = max(1, repeats // 3) if name == "reset" else repeats
        op(0)  # once untimed: caches, connections
        with CpuSampler(host_pids) as sampler:
            t0 = time.perf_counter()
            for i in range(n):
                op(i + 1)
            wall = time.perf_counter() - t0
        kinds = {k: round(v / n, 4) for k, v in sampler.by_kind().items()}
        desktop = sum(v for k, v in kinds.items() if not k.startswith("host:"))
        out[name] = {
            "repeats": n,
            "wall_s": round(wall / n, 3),
            "desktop_cpu_s": round(desktop, 4),
            "host_cpu_s": round(sum(kinds.values()) - desktop, 4),
            "by_kind": kinds,
        }
    return out
