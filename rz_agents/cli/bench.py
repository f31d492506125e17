"""`rz bench NAME [args]`: run one of the repository's benchmarks (bench/NAME.py), each printing ratios
measured in one run (ours vs the peer on the same work)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

BENCHMARKS = {
    "kernels": "aligned vs standard op set, and ours vs HF transformers (training forward, batched decode)",
    "engine": "decode throughput: rz aligned / rz standard / HF generate / vLLM-CPU",
    "sandbox": "Python sandbox round trip and calls/s vs a fresh interpreter per call",
    "async_vs_sync": "training-step throughput of async (lag 64) vs synchronous training",
    "osworld": "OSWorld desktop reset/step/evaluate timings",
}


def bench_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "bench"


def add_parser(sub: argparse._SubParsersAction) -> None:
    lines = "\n".join(f"  {k:14s} {v}" for k, v in BENCHMARKS.items())
    p = sub.add_parser(
        "bench",
        help="run a benchmark from bench/ (prints measured ratios)",
        description=f"Run bench/NAME.py from the source checkout; extra arguments are passed on.\n\n{lines}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", choices=sorted(BENCHMARKS))
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark (e.g. --json)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    script = bench_dir() / f"{args.name}.py"
    if not script.is_file():
        print(f"rz bench: {script} not found (benchmarks ship with the source checkout)", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, str(script), *args.args])
