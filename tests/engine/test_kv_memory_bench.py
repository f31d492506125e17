"""bench/kv_memory.py drives the real page pool and scheduler: at a small size it still shows the
paged cache holding close to the tokens it stores and admitting several times a slot cache's count."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("kv_memory", ROOT / "bench" / "kv_memory.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kv_memory_bench_reports_bytes_per_token_and_capacity_vs_slots():
    result = _bench().main(["--sequences", "64", "--group", "8", "--budget-slots", "8"])
    # waste is at most the last page of each sequence and a copied partial prompt page
    assert 1.0 <= result["kv_bytes_over_tokens"] <= 1.2
    assert result["kv_bytes_over_sequence_tokens"] < result["kv_bytes_over_tokens"]  # prompts shared
    assert result["paged_capacity"] > 2 * result["slot_capacity"]
    assert result["kv_bytes_used"] < result["slot_cache_bytes_for_all"] / 3
