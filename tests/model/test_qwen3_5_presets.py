"""The released Qwen3.5 sizes as dry-run presets (model/presets.py QWEN3_5_PRESETS): each builds on the meta
device at the size its name says, its engine page is what the cache allocates, and the memory estimate sizes
it with the recurrent state as terms of their own (model/qwen3_5_memory.py)."""

from __future__ import annotations

import pytest
import torch

from rz_agents.model.kv_cache import PAGE_SIZE
from rz_agents.model.presets import preset_config, preset_for_checkpoint
from rz_agents.model.qwen3_5 import Qwen35ForCausalLM
from rz_agents.model.qwen3_5_cache import HybridCache, hybrid_bytes_per_page, hybrid_page_terms
from rz_agents.model.qwen3_5_config import Qwen35Config
from rz_agents.model.qwen3_5_memory import engine_cache_terms

# preset -> (the size its name says, the text decoder's exact parameter count). The released names count the
# vision tower and the multi-token-prediction layer too, which rz's text decoder leaves out: within 7%.
SIZES = {
    "qwen3.5-0.8b": (0.8e9, 752_393_024),
    "qwen3.5-2b": (2e9, 1_881_825_088),
    "qwen3.5-4b": (4e9, 4_205_751_296),
    "qwen3.5-9b": (9e9, 8_953_803_264),
    "qwen3.5-27b": (27e9, 26_895_998_464),
    "qwen3.5-35b-a3b": (35e9, 34_660_610_688),  # qwen3_5_moe: 256 experts of 512, top 8, a shared expert
}


def _meta_model(name: str) -> Qwen35ForCausalLM:
    with torch.device("meta"):
        return Qwen35ForCausalLM(preset_config(name))


@pytest.mark.parametrize("name", sorted(SIZES))
def test_each_released_size_builds_on_meta_at_its_published_size(name):
    named, exact = SIZES[name]
    model = _meta_model(name)
    n = model.num_parameters()
    assert n == exact
    assert abs(n / named - 1) < 0.07, f"{name}: {n / 1e9:.2f}B"
    assert model.lm_head.weight.device.type == "meta"
    config = model.config
    assert config.layer_types.count("full_attention") * 4 == config.num_hidden_layers  # one in four
    assert (config.head_dim, config.rotary_dim, config.vocab_size) == (256, 64, 248320)


def test_only_the_small_sizes_tie_their_embeddings():
    tied = {name for name in SIZES if preset_config(name).tie_word_embeddings}
    assert tied == {"qwen3.5-0.8b", "qwen3.5-2b", "qwen3.5-4b"}


def test_a_checkpoint_directory_named_for_a_release_finds_its_preset():
    assert preset_for_checkpoint("/models/Qwen3.5-4B") == "qwen3.5-4b"
    assert preset_for_checkpoint("/models/Qwen3.5-35B-A3B") == "qwen3.5-35b-a3b"
    assert preset_config("Qwen3.5-9B", dtype="float32").dtype == "float32"


def test_the_moe_release_routes_every_layer_through_256_experts():
    config = preset_config("qwen3.5-35b-a3b")
    assert config.model_type == "qwen3_5_moe_text" and config.intermediate_size == 0
    moe = (config.num_experts, config.num_experts_per_tok, config.shared_expert_intermediate_size)
    assert moe == (256, 8, 512)
    model = _meta_model("qwen3.5-35b-a3b")
    experts = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    active = model.num_parameters() - experts * (256 - 8) // 256
    # "A3B": ~3B active per token (3.45B counting the untied embedding and LM head, 1.02B)
    assert 3.4e9 < active < 3.5e9, active


def test_the_4b_page_is_74_mib_with_a_snapshot_per_page_and_38_with_one_per_four():
    config = preset_config("qwen3.5-4b")
    every_page = {k: v / 2**20 for k, v in hybrid_page_terms(config, snapshot_every=1).items()}
    assert every_page == {"kv": 2.0, "recurrent_inputs": 24.375, "state_snapshots": 48.0}
    terms = hybrid_page_terms(config)  # the default: one snapshot slot per SNAPSHOT_EVERY (4) pages
    assert terms["state_snapshots"] / 2**20 == 12.0
    assert hybrid_bytes_per_page(config) == sum(terms.values()) == int(38.375 * 2**20)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_estimates_cache_terms_are_what_the_cache_allocates(dtype):
    config = Qwen35Config.tiny()
    cache = HybridCache(config, num_pages=3, dtype=dtype)
    allocated = sum(t.numel() * t.element_size() for t in cache.buffers())
    terms = engine_cache_terms(config, pages=3, running=0, dtype=dtype)
    assert terms["recurrent_step_state"] == 0
    assert terms["kv_cache"] + terms["recurrent_inputs"] + terms["state_snapshots"] == allocated
    state = sum(t.numel() * t.element_size() for t in cache.state.values())
    assert terms["state_snapshots"] == state
    assert cache.bytes_total == allocated and cache.slots.num_slots == 1 and PAGE_SIZE == 64


def test_the_dry_run_estimate_reports_the_recurrent_state_as_terms_of_their_own():
    from rz_agents.engine import EngineConfig
    from rz_agents.runtime import ModelSpec, TrainConfig
    from rz_agents.runtime.memory_estimate import estimate_memory, model_config_of

    engine = EngineConfig(max_running=8, max_len=4096, kv_cache_bytes=4 << 30)
    cfg = TrainConfig(engine=engine, model=ModelSpec(model_type="qwen3_5", dtype="bfloat16", device="cuda"))
    tiny, source = model_config_of(cfg.model)
    assert isinstance(tiny, Qwen35Config) and "Qwen3.5" in source
    moe, source = model_config_of(ModelSpec(model_type="qwen3_5_moe"))
    assert moe.num_experts == 8 and "Qwen3.5-MoE" in source
    released = preset_config("qwen3.5-4b")
    est = estimate_memory(cfg, released, "qwen3.5-4b")
    assert est.parameters == SIZES["qwen3.5-4b"][1]
    pages = (4 << 30) // hybrid_bytes_per_page(released)
    assert est.engine["state_snapshots"] == (pages // 4) * 48 * 2**20  # a 48 MiB slot per 4 pages
    assert est.engine["recurrent_inputs"] == pages * hybrid_page_terms(released)["recurrent_inputs"]
    assert est.engine["kv_cache"] == pages * 2 * 2**20  # the 8 full-attention layers' K/V only
    assert est.engine["recurrent_step_state"] > 0
    assert any("delta-rule state snapshots 12.0 MiB (one slot of 48 MiB per 4 pages)" in n for n in est.notes)
    # the Gated DeltaNet layers' activations are sized by the model, not as attention layers
    assert est.learner["activations"] > 0
