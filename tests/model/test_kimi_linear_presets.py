"""The Kimi-Linear-48B-A3B preset: its published shapes build on the meta device to the released size (49.1B
parameters, 3.5B active per token with the embeddings); its engine cache page is sized with the KDA state; a
released checkpoint's directory name finds it (`rz train --dry-run`), and the memory estimate's cache terms
(model/kimi_linear_memory.py) are what the cache allocates."""

import pytest
import torch

from rz_agents.model.kimi_linear import KimiLinearForCausalLM
from rz_agents.model.kimi_linear_cache import KimiLinearCache, kimi_bytes_per_page
from rz_agents.model.kimi_linear_config import KimiLinearConfig
from rz_agents.model.kimi_linear_memory import engine_cache_terms, layer_activation_bytes
from rz_agents.model.kimi_linear_presets import kimi_linear_preset
from rz_agents.model.memory_terms import hybrid_memory_terms
from rz_agents.model.presets import preset_config, preset_for_checkpoint


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


def test_a_released_checkpoint_directory_name_finds_the_preset():
    assert preset_for_checkpoint("/models/Kimi-Linear-48B-A3B-Instruct") == "kimi-linear-48b-a3b"
    assert preset_for_checkpoint("/models/Kimi-Linear-48B-A3B-Base") == "kimi-linear-48b-a3b"
    assert preset_for_checkpoint("/models/Kimi-Linear-1B") is None
    config = preset_config("Kimi-Linear-48B-A3B-Instruct", dtype="float32")
    assert isinstance(config, KimiLinearConfig) and config.dtype == "float32"
    with pytest.raises(KeyError, match="only dtype"):
        preset_config("kimi-linear-48b-a3b", hidden_size=64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_estimates_cache_terms_are_what_the_cache_allocates(dtype):
    config = KimiLinearConfig.tiny()
    cache = KimiLinearCache(config, num_pages=5, dtype=dtype)
    allocated = sum(t.numel() * t.element_size() for t in cache.buffers())
    terms = engine_cache_terms(config, pages=5, running=0, dtype=dtype)
    assert terms["recurrent_step_state"] == 0
    assert terms["kv_cache"] + terms["recurrent_inputs"] + terms["state_snapshots"] == allocated
    assert terms["state_snapshots"] == sum(t.numel() * t.element_size() for t in cache.state.values())
    assert terms["kv_cache"] == sum(
        t.numel() * t.element_size() for t in (*cache.k.values(), *cache.v.values())
    )


def test_the_48b_estimate_terms_count_the_kda_state_and_size_each_layer_by_its_kind():
    cfg = kimi_linear_preset("kimi-linear-48b-a3b")
    assert (
        hybrid_memory_terms(cfg) is not None
        and hybrid_memory_terms(cfg).engine_cache_terms is engine_cache_terms
    )
    mib = 2**20
    terms = engine_cache_terms(cfg, pages=400, running=16, dtype=torch.bfloat16)
    assert terms["kv_cache"] == 400 * 14 * mib  # 7 MLA layers x 32 heads x 64 positions x 256 (padded) x K, V
    assert (
        terms["state_snapshots"] == 100 * 40 * mib
    )  # a slot per 4 pages: 20 KDA layers x 32 x 128 x 128 fp32
    # per running sequence, one KDA layer: the state read and the one advanced (fp32), the conv window (bf16)
    assert terms["recurrent_step_state"] == 16 * (2 * 4 * 32 * 128 * 128 + 3 * 3 * 4096 * 2)
    per_layer = layer_activation_bytes(cfg, 1024)
    assert len(per_layer) == 27
    kda, mla = per_layer[1], per_layer[3]  # (layer 0: the dense MLP; layer 3: the first MLA layer)
    assert cfg.layer_types[1] == "linear_attention" and cfg.layer_types[3] == "full_attention"
    assert kda != mla and per_layer[0] != per_layer[1]  # mixers and MLPs sized by their kind
