"""Memory estimate of a vision-language policy (Qwen3-VL): the tower's weights counted exactly (against a tiny
model built from the same config), its masters/gradients/AdamW state when trained and not when frozen, its
activations per image token, the engine's encoded-image budget; the published Qwen3-VL sizes; and the packaged
real-size recipe dry-runs."""

from __future__ import annotations

import copy
import dataclasses

import torch

from rz_agents.cli import main as rz_main
from rz_agents.engine import EngineConfig
from rz_agents.model.presets import preset_config, preset_for_checkpoint
from rz_agents.model.qwen3_vl import Qwen3VLModel
from rz_agents.runtime import ModelSpec, TrainConfig
from rz_agents.runtime.memory_estimate import (
    estimate_memory,
    model_config_of,
    tokens_per_image,
    vision_token_bytes,
)


def _spec(dtype: str) -> ModelSpec:
    return ModelSpec(model_type="qwen3_vl", dtype=dtype, tiny_overrides={"vision": {"depth": 3}})


def test_tiny_vl_weights_are_exact_and_the_tower_is_counted():
    cfg = TrainConfig(model=_spec("bfloat16"), engine=EngineConfig(image_cache_bytes=3 << 20))
    vl, source = model_config_of(cfg.model, vocab_size=320)
    assert "Qwen3-VL" in source and vl.vision.depth == 3
    model = Qwen3VLModel(vl)  # the model the run would build from this config
    unique = {p.data_ptr(): p for p in model.parameters()}.values()
    tower = sum(p.numel() for p in model.visual.parameters())
    est = estimate_memory(cfg, vl)
    assert est.parameters == model.num_parameters() == sum(p.numel() for p in unique)
    assert est.learner["weights"] == sum(p.numel() * p.element_size() for p in unique)  # exact bytes
    assert est.vision_parameters == tower > 0
    n = est.parameters
    assert est.learner["master_weights_fp32"] == 4 * n and est.learner["adamw_state_fp32"] == 8 * n
    assert est.engine["weights"] == est.learner["weights"] and est.engine["image_encodings"] == 3 << 20
    # frozen (learner.freeze_vision, read when the learner config has it): no masters or AdamW for the tower
    learner = copy.copy(cfg.learner)
    object.__setattr__(learner, "freeze_vision", True)
    frozen = estimate_memory(dataclasses.replace(cfg, learner=learner), vl)
    assert frozen.learner["master_weights_fp32"] == 4 * (n - tower)
    assert frozen.learner["adamw_state_fp32"] == 8 * (n - tower)
    assert frozen.learner["weights"] == est.learner["weights"]
    assert 0 < frozen.learner["vision_activations"] < est.learner["vision_activations"]
    # the tower's activations follow the micro-batch's tokens
    per = vision_token_bytes(vl, 2)
    tokens = max(cfg.learner.micro_batch_tokens, cfg.rollout.limits.max_episode_tokens)
    assert est.learner["vision_activations"] == tokens * per["trained_activations"]
    on_spec = dataclasses.replace(cfg.model, activation_checkpointing=True)
    on = estimate_memory(dataclasses.replace(cfg, model=on_spec), vl)
    assert on.learner["vision_activations"] == tokens * per["checkpointed_activations"]
    assert per["checkpointed_activations"] < per["trained_activations"]
    assert per["encoding"] == vl.text.hidden_size * (1 + len(vl.vision.deepstack_visual_indexes)) * 2


def test_published_qwen3_vl_sizes():
    sizes = {}
    for name in ("qwen3-vl-2b-instruct", "qwen3-vl-4b-instruct", "qwen3-vl-8b-instruct"):
        vl = preset_config(name)
        with torch.device("meta"):
            model = Qwen3VLModel(vl, init=False)
        sizes[name] = (model.num_parameters(), sum(p.numel() for p in model.visual.parameters()))
    assert 2.12e9 < sizes["qwen3-vl-2b-instruct"][0] < 2.14e9  # "2B": 2.13B
    assert sizes["qwen3-vl-4b-instruct"] == (4_437_815_808, 415_347_712)  # "4B": 4.44B
    assert 8.76e9 < sizes["qwen3-vl-8b-instruct"][0] < 8.78e9  # "8B": 8.77B
    assert preset_for_checkpoint("/models/Qwen3-VL-4B-Instruct") == "qwen3-vl-4b-instruct"
    vl = preset_config("qwen3-vl-4b-instruct")
    assert vl.text.tie_word_embeddings and vl.vision.deepstack_visual_indexes == [5, 11, 17]
    assert tokens_per_image(vl) == 980  # a screenshot at the processor's 1,003,520-pixel cap
    # 980 tokens x 2,560 x (1 + 3 deepstack) x bf16 = 19.1 MiB encoded
    assert 980 * vision_token_bytes(vl, 2)["encoding"] == 20_070_400


def test_rz_train_dry_run_of_the_qwen3_vl_4b_recipe(capsys):
    assert rz_main(["train", "qwen3-vl-4b-osworld", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "qwen3-vl-4b-instruct (published config" in out and "4.44B parameters" in out
    for part in ("vision_activations", "image_encodings", "vision_step_activations", "415,347,712"):
        assert part in out
    replica = next(line for line in out.splitlines() if "per engine replica" in line)
    rank = next(line for line in out.splitlines() if "per learner rank" in line)
    assert "H200 141GB: fits" in replica and "H200 141GB: fits" in rank
