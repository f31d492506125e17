"""Memory estimate of a Qwen3.5 vision-language policy: the tower is counted (the same term as Qwen3-VL's),
exactly as the tiny model the run builds holds it, with the hybrid decoder's own cache terms; the released
sizes with their towers are dry-run presets (``qwen3.5-4b-vl``), and the visual-click demo's dry run shows the
tower."""

from __future__ import annotations

import torch

from rz_agents.cli import main as rz_main
from rz_agents.model.policy import PolicySpec, build_policy
from rz_agents.model.presets import preset_config, preset_for_checkpoint
from rz_agents.model.qwen3_5_vl import Qwen35VLForConditionalGeneration
from rz_agents.model.qwen3_5_vl_config import Qwen35VLConfig
from rz_agents.runtime import ModelSpec, TrainConfig
from rz_agents.runtime.memory_estimate import count_vision_parameters, estimate_memory, model_config_of

VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2}
VISION["num_position_embeddings"] = 16


def test_the_tiny_qwen3_5_tower_is_counted_as_the_run_builds_it():
    spec = ModelSpec(model_type="qwen3_5", dtype="bfloat16", tiny_overrides={"vision": VISION})
    config, source = model_config_of(spec, vocab_size=320)
    assert isinstance(config, Qwen35VLConfig) and "vision-language" in source
    model = build_policy(PolicySpec(model_type="qwen3_5", vocab_size=320, tiny_overrides={"vision": VISION}))
    assert isinstance(model, Qwen35VLForConditionalGeneration)
    tower = sum(p.numel() for p in model.visual.parameters())
    est = estimate_memory(TrainConfig(model=spec), config)
    assert est.vision_parameters == tower > 0
    assert est.parameters == model.num_parameters()  # decoder and tower, exactly
    assert est.learner["vision_activations"] > 0 and est.engine["image_encodings"] > 0
    assert est.engine["recurrent_inputs"] > 0  # the hybrid decoder's own cache terms still apply
    assert any("vision tower: " + f"{tower:,} parameters" in n for n in est.notes)


def test_the_released_4b_with_its_tower_is_a_preset():
    config = preset_config("qwen3.5-4b-vl")
    assert isinstance(config, Qwen35VLConfig)
    assert (config.vision.depth, config.vision.hidden_size, config.vision.out_hidden_size) == (24, 1024, 2560)
    assert config.text == preset_config("qwen3.5-4b")  # the text decoder is the text preset's
    assert preset_for_checkpoint("/models/Qwen3.5-4B-VL") == "qwen3.5-4b-vl"
    with torch.device("meta"):
        model = Qwen35VLForConditionalGeneration(config)
    tower = sum(p.numel() for p in model.visual.parameters())
    assert count_vision_parameters(config) == tower
    assert 0.3e9 < tower < 0.35e9  # a Qwen3-VL-4B-sized tower (24 blocks of 1024)


def test_the_visual_click_demo_dry_run_shows_the_tower(capsys):
    assert rz_main(["train", "configs/qwen3_5-visual-click-demo.yaml", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "vision tower: " in out and "vision_activations" in out and "image_encodings" in out
