"""The DeepSeek-V4-Flash preset builds on the meta device with the published parameter count (284B)."""

import pytest
import torch

from rz_agents.model.deepseek_v4 import DeepseekV4ForCausalLM
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
        deepseek_v4_preset("deepseek-v4-pro")
