"""Sandbox benchmark: what a Python tool call costs.

Measures, on this machine:
  p50_ms / p99_ms        round trip of a small call (``x = 1 + 1``) in a warm session
  calls_per_s            total throughput with --sessions concurrent sessions (one thread each,
                         --calls calls per session), all sharing the machine's cores
  fresh_process_p50_ms   the alternative: a fresh ``python -c`` per call (no sandbox at all)
  fresh_sandbox_p50_ms   a fresh sandboxed session per call (start + first call)

  python bench/sandbox.py                    # human-readable
  python bench/sandbox.py --json             # one JSON object on stdout
  python bench/sandbox.py --backend docker   # one container per session (scripts/install.sh --docker)
Goal (issue 5): p50 <= 20 ms, >= 100 calls/s.
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


def concurrent_throughput(sessions: int, calls: int, backend: str = "local") -> tuple[float, float]:
    """(calls per second, seconds) for ``sessions`` sessions each making ``calls`` calls at once."""
    sandboxes = [PythonSandbox(backend=backend) for _ in range(sessions)]
    try:
        for sb in sandboxes:
            sb.run("0")  # booted before the clock starts
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
        if errors:
            raise RuntimeError(f"{len(errors)} wrong results, first: {errors[0]}")
        return sessions * calls / elapsed, elapsed
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
    parser.add_argument("--sessions", type=int, default=64, help="concurrent sessions for calls_per_s")
    parser.add_argument("--calls-per-session", type=int, default=50)
    parser.add_argument("--fresh", type=int, default=30, help="fresh processes / sandboxes to time")
    parser.add_argument("--backend", choices=("local", "docker"), default="local", help="sandbox backend")
    args = parser.parse_args()

    warm = warm_round_trips(args.calls, args.backend)
    rate, elapsed = concurrent_throughput(args.sessions, args.calls_per_session, args.backend)
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
        "fresh_process_p50_ms": round(statistics.median(fresh) * 1000, 2),
        "fresh_sandbox_p50_ms": round(statistics.median(fresh_sb) * 1000, 2),
        "cpus": os.cpu_count(),
        "goal_met": statistics.median(warm) <= 0.020 and rate >= 100,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"warm call round trip   p50 {result['p50_ms']:.3f} ms   p99 {result['p99_ms']:.3f} ms  ({args.calls} calls)"
    )
    print(
        f"{args.sessions} concurrent sessions  {result['calls_per_s']:.0f} calls/s "
        f"({result['concurrent_calls']} calls in {elapsed:.2f} s, {result['cpus']} CPUs)"
    )
    print(f"fresh `python -c` per call   p50 {result['fresh_process_p50_ms']:.1f} ms")
    print(f"fresh sandbox per call       p50 {result['fresh_sandbox_p50_ms']:.1f} ms")
    print(f"goal (p50 <= 20 ms, >= 100 calls/s): {'met' if result['goal_met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
