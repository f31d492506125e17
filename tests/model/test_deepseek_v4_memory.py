"""DeepSeek-V4's cache sizes as the model reports them (model/deepseek_v4_memory.py) equal what its
SequenceState holds after real forwards, and `rz train --dry-run` prints them for the V4-Flash config."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rz_agents.cli import main as rz_main
from rz_agents.model.deepseek_v4 import DeepseekV4ForCausalLM
from rz_agents.model.deepseek_v4_attention import Reach, SequenceState
from rz_agents.model.deepseek_v4_cache import archive_span, pages_held, v4_bytes_per_page
from rz_agents.model.deepseek_v4_config import DeepseekV4Config
from rz_agents.model.deepseek_v4_memory import cache_sizes, rows_held
from rz_agents.model.deepseek_v4_presets import deepseek_v4_preset


def _held_bytes(state: SequenceState) -> tuple[int, int]:
    rows = sum(t.numel() * t.element_size() for t in state.rows.values())
    entries = sum(t.numel() * t.element_size() for t in state.entries.values())
    return rows, entries


@pytest.mark.parametrize("hca_rate, window", [(16, 16), (32, 8)])
def test_cache_sizes_equal_what_the_sequence_state_holds(hca_rate, window):
    cfg = DeepseekV4Config.tiny(hca_rate=hca_rate, sliding_window=window, dtype="bfloat16")
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM(cfg).to(torch.bfloat16)
    sizes = cache_sizes(cfg, 2)
    reach = Reach(cfg.sliding_window, cfg.csa_rate, cfg.hca_rate)
    state, seen, most = SequenceState(), 0, 0
    for chunk in (5, 11, 16, 1, 1, 30, 1, 63):  # prefill chunks, then decode-sized calls
        tokens = torch.randint(0, cfg.vocab_size, (chunk,))
        with torch.no_grad():
            model(
                tokens, torch.arange(seen, seen + chunk), torch.zeros(chunk, dtype=torch.long), states=[state]
            )
        seen += chunk
        rows, entries = _held_bytes(state)
        held = seen - reach.first_needed(seen)
        most = max(most, held)
        # rows: the bounded per-sequence terms, in proportion to the positions held
        assert rows * sizes.rows_held == held * sum(sizes.per_sequence.values())
        # entries: one per complete window of each rate
        per_entry = {
            "csa_compressed_kv": cfg.head_dim * 2,
            "indexer_keys": cfg.index_head_dim * 2,
            "hca_compressed_kv": cfg.head_dim * 2,
        }
        rates = {
            "csa_compressed_kv": cfg.csa_rate,
            "indexer_keys": cfg.csa_rate,
            "hca_compressed_kv": hca_rate,
        }
        expected = sum(
            (seen // rates[k]) * per_entry[k] * round(sizes.per_token[k] * rates[k] / per_entry[k])
            for k in per_entry
        )
        assert entries == expected
        if seen % hca_rate == 0:  # whole windows of both rates: exactly the per-token figure
            assert entries == seen * sum(sizes.per_token.values())
    assert most <= rows_held(cfg) == sizes.rows_held


def test_the_flash_preset_reports_its_caches_per_token():
    sizes = cache_sizes(deepseek_v4_preset("deepseek-v4-flash"), 2)
    # 20 CSA layers (512-wide K/V and 128-wide indexer keys every 4 tokens), 23 HCA layers (every 128)
    assert sizes.per_token == {
        "csa_compressed_kv": 20 * 512 * 2 / 4,
        "hca_compressed_kv": 23 * 512 * 2 / 128,
        "indexer_keys": 20 * 128 * 2 / 4,
    }
    assert sizes.rows_held == 127  # the 128-token sliding window


def test_rz_train_dry_run_prints_the_v4_flash_caches_per_device(capsys):
    config = Path(__file__).resolve().parents[2] / "configs" / "deepseek-v4-flash-h200.yaml"
    assert rz_main(["train", str(config), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "284.33B parameters" in out and "paged_caches" in out
    assert "csa_compressed_kv 5,120, hca_compressed_kv 184, indexer_keys 1,280 bytes" in out
    assert "sliding_window_kv 5.3 MiB" in out
    # the engine's paged cache as allocated (model/deepseek_v4_cache.py): 200,304 bytes per position of a
    # page, and with the pages behind the window given back (the default) a max_len sequence holds
    # pages_held pages: the 2 from the window on + 5 archive pages for the 126 given back (29 to a page)
    flash = deepseek_v4_preset("deepseek-v4-flash")
    page = v4_bytes_per_page(flash)
    assert page // 64 == 200_304 and "200,304 bytes per position" in out
    assert archive_span(flash) == 29 and pages_held(flash, 8192) == 2 + 5
    held = pages_held(flash, 8192) * page
    assert f"a max_len sequence {held / 2**20:.1f} MiB" in out and "given back" in out
    assert f"paged_caches                     {64 * held / 2**30:.2f} GiB" in out
    rank = next(line for line in out.splitlines() if "per learner rank" in line)
    replica = next(line for line in out.splitlines() if "per engine replica" in line)
    assert "FSDP2 over 128 ranks" in rank and "H200 141GB: fits" in rank
    assert "H200 141GB: does NOT fit" in replica  # 530 GiB of bf16 weights on one GPU: stated, not hidden


def test_rz_train_dry_run_sizes_v4_pro_and_says_it_does_not_fit(capsys):
    config = Path(__file__).resolve().parents[2] / "configs" / "deepseek-v4-pro-h200.yaml"
    assert rz_main(["train", str(config), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "deepseek-v4-pro (published config; absent here), 1572.97B parameters" in out
    assert "csa_compressed_kv 7,424, hca_compressed_kv 256, indexer_keys 1,856 bytes" in out
    rank = next(line for line in out.splitlines() if "per learner rank" in line)
    assert "FSDP2 over 512 ranks" in rank and "H200 141GB: does NOT fit" in rank  # two gathered 25.8B layers
