"""Sandbox benchmark: what a Python tool call costs, alone and with --sessions sessions open.

Measures, on this machine:
  p50_ms / p99_ms        round trip of a small call (``x = 1 + 1``) in a warm session
  open_*                 with --sessions sessions open at once (the production configs keep 1,024
                         episodes in flight): session start rate (all started at once, until every
                         one has answered its first call), resident memory per session (RSS, and
                         PSS, which splits shared pages fairly), p50/p99 of a small call made
                         round-robin across all open sessions (one at a time), and how many sessions
                         are still alive and answer correctly at the end
  calls_per_s            total throughput with the --sessions sessions called concurrently (one
                         thread each, --calls-per-session calls per session), all sharing the cores
  fresh_process_p50_ms   the alternative: a fresh ``python -c`` per call (no sandbox at all)
  fresh_sandbox_p50_ms   a fresh sandboxed session per call (start + first call)

  python bench/sandbox.py                       # human-readable
  python bench/sandbox.py --json --sessions 1024
  python bench/sandbox.py --backend docker      # one container per session (scripts/install.sh --docker)
Goals: p50 <= 20 ms and >= 100 calls/s (issue 5); with 1,024 sessions open, p99 <= 5 ms and every
session alive (issue 15).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from rz_agents.envs.python_tool import PythonSandbox


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def warm_round_trips(n: int, backend: str = "local") -> list[float]:
    with PythonSandbox(backend=backend) as sb:
        for _ in range(20):  # warm-up
            sb.run("x = 1 + 1")
        times = []
        for _ in range(n):
            start = time.perf_counter()
            r = sb.run("x = 1 + 1")
            times.append(time.perf_counter() - start)
            assert r.ok, r
    return times


def _descendants_memory() -> tuple[int, int, int]:
    """(processes, RSS bytes, PSS bytes) of every descendant of this process (the sandboxes)."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            parent[int(name)] = int(stat[stat.rindex(b")") + 2 :].split()[1])
    mine, frontier = set(), [os.getpid()]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in mine]
        mine.update(kids)
        frontier.extend(kids)
    rss = pss = 0
    for pid in mine:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return len(mine), rss, pss


def open_sessions(n: int, calls: int, backend: str = "local") -> tuple[dict, list[PythonSandbox]]:
    """Start n sessions at once; measure start rate, memory per session, and call latency with all open."""
    start = time.perf_counter()
    sandboxes: list[PythonSandbox] = []
    try:
        for _ in range(n):
            sandboxes.append(PythonSandbox(backend=backend))  # each spawns its worker in the background
        for sb in sandboxes:
            assert sb.run("0").ok  # waits for that worker's boot
        started_s = time.perf_counter() - start
        procs, rss, pss = _descendants_memory()
        times = []
        for i in range(calls):
            sb = sandboxes[i % n]
            t0 = time.perf_counter()
            r = sb.run("x = 1 + 1")
            times.append(time.perf_counter() - t0)
            assert r.ok, r
        alive = sum(1 for i, sb in enumerate(sandboxes) if sb.run(f"{i} * 3").stdout == f"{i * 3}\n")
    except BaseException:
        for sb in sandboxes:
            sb.close()
        raise
    return {
        "open_sessions": n,
        "open_sessions_alive": alive,
        "open_start_per_s": round(n / started_s, 1),
        "open_start_seconds": round(started_s, 2),
        "open_processes": procs,
        "open_rss_mib_per_session": round(rss / n / 2**20, 2),
        "open_pss_mib_per_session": round(pss / n / 2**20, 2),
        "open_call_p50_ms": round(statistics.median(times) * 1000, 3),
        "open_call_p99_ms": round(percentile(times, 0.99) * 1000, 3),
        "open_calls": calls,
    }, sandboxes


def concurrent_throughput(sandboxes: list[PythonSandbox], calls: int) -> tuple[float, float, list[str]]:
    """(calls per second, seconds, wrong results) for every open session making ``calls`` calls at once.

    A call that times out or answers wrongly is counted (and its session goes on), not fatal: with
    1,024 sessions on a loaded 2-core machine a few calls can outlast the per-call wall limit."""
    sessions = len(sandboxes)
    try:
        barrier = threading.Barrier(sessions + 1)
        errors: list[str] = []

        def worker(sb: PythonSandbox) -> None:
            barrier.wait()
            for i in range(calls):
                r = sb.run(f"y = {i} * 2\ny")
                if r.stdout != f"{i * 2}\n":
                    errors.append(repr(r))

        threads = [threading.Thread(target=worker, args=(sb,)) for sb in sandboxes]
        for t in threads:
            t.start()
        barrier.wait()
        start = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        return sessions * calls / elapsed, elapsed, errors
    finally:
        for sb in sandboxes:
            sb.close()


def fresh_process(n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", "x = 1 + 1; print(x)"], capture_output=True, check=True)
        times.append(time.perf_counter() - start)
        assert out.stdout == b"2\n"
    return times


def fresh_sandbox(n: int, backend: str = "local") -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        with PythonSandbox(backend=backend) as sb:
            assert sb.run("x = 1 + 1; x").stdout == "2\n"
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    """Run the benchmark and print the results."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--calls", type=int, default=1000, help="warm round trips to time")
    parser.add_argument(
        "--sessions", type=int, default=64, help="sessions open at once (and called concurrently)"
    )
    parser.add_argument("--calls-per-session", type=int, default=50)
    parser.add_argument(
        "--open-calls",
        type=int,
        default=None,
        help="round-robin calls with all open (default 2 per session, >= 1000)",
    )
    parser.add_argument("--fresh", type=int, default=30, help="fresh processes / sandboxes to time")
    parser.add_argument("--backend", choices=("local", "docker"), default="local", help="sandbox backend")
    args = parser.parse_args()

    load0 = os.getloadavg()[0]
    warm = warm_round_trips(args.calls, args.backend)
    opened, sandboxes = open_sessions(
        args.sessions, args.open_calls or max(1000, 2 * args.sessions), args.backend
    )
    rate, elapsed, wrong = concurrent_throughput(sandboxes, args.calls_per_session)
    fresh = fresh_process(args.fresh)
    fresh_sb = fresh_sandbox(args.fresh, args.backend)
    result = {
        "backend": args.backend,
        "p50_ms": round(statistics.median(warm) * 1000, 3),
        "p99_ms": round(percentile(warm, 0.99) * 1000, 3),
        "calls_per_s": round(rate, 1),
        "concurrent_sessions": args.sessions,
        "concurrent_calls": args.sessions * args.calls_per_session,
        "concurrent_seconds": round(elapsed, 3),
        "concurrent_wrong_results": len(wrong),
        "concurrent_first_wrong": wrong[0][:300] if wrong else None,
        "fresh_process_p50_ms": round(statistics.median(fresh) * 1000, 2),
        "fresh_sandbox_p50_ms": round(statistics.median(fresh_sb) * 1000, 2),
        "cpus": os.cpu_count(),
        "goal_met": statistics.median(warm) <= 0.020 and rate >= 100 and not wrong,
        **opened,
        "open_goal_met": opened["open_call_p99_ms"] <= 5.0 and opened["open_sessions_alive"] == args.sessions,
        "loadavg_start_end": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"warm call round trip   p50 {result['p50_ms']:.3f} ms   p99 {result['p99_ms']:.3f} ms  "
        f"({args.calls} calls)"
    )
    print(
        f"{args.sessions} concurrent sessions  {result['calls_per_s']:.0f} calls/s "
        f"({result['concurrent_calls']} calls in {elapsed:.2f} s, {result['cpus']} CPUs; {len(wrong)} wrong "
        "or timed out)"
    )
    print(
        f"{args.sessions} sessions open: started {result['open_start_per_s']:.1f}/s, "
        f"{result['open_rss_mib_per_session']:.1f} MiB RSS ({result['open_pss_mib_per_session']:.1f} MiB "
        f"PSS) each, call p50 {result['open_call_p50_ms']:.2f} ms p99 {result['open_call_p99_ms']:.2f} ms, "
        f"{result['open_sessions_alive']} alive"
    )
    print(f"fresh `python -c` per call   p50 {result['fresh_process_p50_ms']:.1f} ms")
    print(f"fresh sandbox per call       p50 {result['fresh_sandbox_p50_ms']:.1f} ms")
    print(f"goal (p50 <= 20 ms, >= 100 calls/s): {'met' if result['goal_met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
