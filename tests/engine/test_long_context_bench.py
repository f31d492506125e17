"""bench/long_context.py runs end to end at a short context and reports every figure (no error entries)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_long_context_bench_reports_engine_and_learner_figures():
    cmd = [sys.executable, str(ROOT / "bench" / "long_context.py"), "--json", "--contexts", "128", "256"]
    cmd += ["--gen", "4", "--no-ckpt-max", "256"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(out.stdout)
    for section in ("engine", "learner"):
        assert [r["context"] for r in result[section]] == [128, 256], result[section]
        assert all("error" not in r for r in result[section]), result[section]
    assert all(r["kv_cache_mb"] > 0 and r["decode_tok_per_cpu_s"] > 0 for r in result["engine"])
