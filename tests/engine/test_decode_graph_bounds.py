"""CUDA graphs of the decode step are keyed by (batch bucket, position bound): the bound is the step's highest
position rounded up to a power-of-two number of 512-key attention splits (never past the step's capacity), so
the attention's decode grid follows the batch's longest context instead of max_len, from a few graphs per
bucket. (The bits do not depend on the bound: tests/kernels/triton_ops/test_attention_splitkv.py.)"""

from __future__ import annotations

import pytest

from rz_agents.engine.decode_step import DecodeStep
from rz_agents.model.kv_cache import KVCache


def _step(tiny_model, width: int) -> DecodeStep:
    model = tiny_model(max_position_embeddings=64 * width)
    cache = KVCache(model.config, num_pages=3, device="cpu")
    return DecodeStep(model, cache, max_batch=8, width=width, scratch_page=2)


def test_graph_bounds_are_power_of_two_splits_up_to_the_capacity(tiny_model):
    step = _step(tiny_model, width=256)  # 16K positions
    assert step.static_max_position == 16383
    assert step.graph_bounds() == [511, 1023, 2047, 4095, 8191, 16383]
    assert [step.graph_max_position(p) for p in (0, 511, 512, 2047, 2048, 9000, 16383)] == [
        511, 511, 1023, 2047, 4095, 16383, 16383,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="exceeds the decode step's 16384 positions"):
        step.graph_max_position(16384)


def test_a_capacity_that_is_not_a_power_of_two_split_count_is_the_last_bound(tiny_model):
    step = _step(tiny_model, width=10)  # 640 positions
    assert step.graph_bounds() == [511, 639] and step.graph_max_position(600) == 639


def test_the_bound_never_more_than_doubles_the_splits_of_the_longest_context(tiny_model):
    step = _step(tiny_model, width=256)
    for top in range(0, 16384, 97):
        real = top // 512 + 1
        bound = step.graph_max_position(top)
        assert bound >= top and real <= bound // 512 + 1 <= 2 * real
