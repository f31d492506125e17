"""The DeepSeek-V4 presets build on the meta device with the published parameter counts (Flash 284B, Pro
1.6T), and the memory estimate's fast count (two experts built, the others counted) equals a full build."""

import pytest
import torch

from rz_agents.model.deepseek_v4 import DeepseekV4ForCausalLM
from rz_agents.model.deepseek_v4_config import DeepseekV4Config
from rz_agents.model.deepseek_v4_memory import parameter_shapes
from rz_agents.model.deepseek_v4_presets import deepseek_v4_preset


def test_v4_flash_preset_has_the_published_size_and_schedule():
    config = deepseek_v4_preset("deepseek-v4-flash")
    # built with 2 routed experts a layer (33k expert modules take a minute to construct), the other 254
    # counted: each is 3 x hidden x moe_intermediate
    with torch.device("meta"):
        model = DeepseekV4ForCausalLM(deepseek_v4_preset("deepseek-v4-flash", n_routed_experts=2), init=False)
    experts = config.num_hidden_layers * (config.n_routed_experts - 2) * 3 * 4096 * 2048
    assert 284.0e9 < model.num_parameters() + experts < 284.7e9
    assert config.layer_types[:3] == ("heavily_compressed_attention",) * 3
    assert config.layer_types.count("compressed_sparse_attention") == 20
    assert config.mlp_layer_types.count("hash_moe") == 3 and config.qk_rope_head_dim == 64
    assert next(model.parameters()).dtype == torch.bfloat16
    with pytest.raises(KeyError, match="deepseek-v4-flash"):
        deepseek_v4_preset("deepseek-v4-ultra")


def test_v4_pro_preset_has_the_published_size_and_schedule():
    config = deepseek_v4_preset("deepseek-v4-pro")
    params, _, _, layer = parameter_shapes(config)
    # 1.573T without the MTP layer rz does not build (num_nextn_predict_layers: 1); with one more layer of
    # the same size (25.8B) 1.599T: the published "1.6T"
    assert 1.57e12 < params < 1.58e12 and 1.59e12 < params + layer < 1.61e12
    assert config.layer_types[:3] == ("heavily_compressed_attention",) * 3
    assert config.layer_types.count("compressed_sparse_attention") == 29
    assert config.mlp_layer_types.count("hash_moe") == 3 and config.qk_rope_head_dim == 64
    assert (config.n_routed_experts, config.index_topk, config.o_groups) == (384, 1024, 16)


def test_the_fast_count_equals_a_full_meta_build():
    config = DeepseekV4Config.tiny(n_routed_experts=6)
    with torch.device("meta"):
        model = DeepseekV4ForCausalLM(config, init=False)
    embed = model.get_input_embeddings().weight
    params = list(model.parameters())
    full = (
        model.num_parameters(),
        sum(p.numel() for p in params if p.dim() == 2 and p is not embed),
        max(p.numel() for p in params),
        max(sum(p.numel() for p in layer.parameters()) for layer in model.model.layers),
    )
    assert parameter_shapes(config) == full
