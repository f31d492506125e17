"""bench/sandbox.py runs and reports the keys the issue asks for."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_bench_json_has_required_keys_and_warm_calls_beat_fresh_processes():
    cmd = [sys.executable, str(ROOT / "bench" / "sandbox.py"), "--json", "--calls", "50", "--sessions", "4"]
    cmd += ["--calls-per-session", "10", "--fresh", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout)
    for key in ("p50_ms", "p99_ms", "calls_per_s", "fresh_process_p50_ms"):
        assert isinstance(result[key], (int, float)) and result[key] > 0
    assert result["p50_ms"] < result["fresh_process_p50_ms"]
    assert result["concurrent_wrong_results"] == 0 and result["concurrent_first_wrong"] is None
