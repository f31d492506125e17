"""The Kimi-Linear-48B-A3B preset: its published shapes build on the meta device to the released size (49.1B
parameters, 3.5B active per token with the embeddings); its engine cache page is sized with the KDA state."""

import pytest
import torch

from rz_agents.model.kimi_linear import KimiLinearForCausalLM
from rz_agents.model.kimi_linear_cache import kimi_bytes_per_page
from rz_agents.model.kimi_linear_presets import kimi_linear_preset


def test_the_48b_preset_builds_to_the_released_size_and_sizes_its_cache_page():
    cfg = kimi_linear_preset("kimi-linear-48b-a3b")
    assert cfg.layer_types.count("linear_attention") == 20 and cfg.layer_types.count("full_attention") == 7
    assert cfg.layer_types[3] == "full_attention" and cfg.layer_types[26] == "full_attention"
    assert cfg.mlp_layer_types[0] == "dense" and cfg.mlp_layer_types.count("sparse") == 26
    with torch.device("meta"):
        model = KimiLinearForCausalLM(cfg)
    total = model.num_parameters()
    expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    active = total - 26 * (cfg.num_experts - cfg.num_experts_per_tok) * expert
    assert 48e9 < total < 50e9, total
    assert 3e9 < active < 3.6e9, active  # (embeddings and LM head included)
    assert model.lm_head.weight.dtype == torch.bfloat16
    # per 64-position page (bf16): 7 MLA layers' expanded K/V, 20 KDA layers' inputs and their share of the
    # state snapshot slots (one per page, or one per 4 pages by default)
    kv = 7 * 2 * 32 * 64 * 256 * 2
    kda = 20 * (64 * (3 * 4096 * 2 + 4 * (4096 + 32)) + 4 * 32 * 128 * 128)
    assert kimi_bytes_per_page(cfg, snapshot_every=1) == kv + kda
    assert kimi_bytes_per_page(cfg) == kv + kda - 20 * 3 * 32 * 128 * 128


def test_an_unknown_preset_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="kimi-linear-48b-a3b"):
        kimi_linear_preset("kimi-linear-1b")
