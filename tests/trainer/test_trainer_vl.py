"""The learner on a vision-language model (Qwen3-VL): trajectories sampled by the rz engine from requests with
images carry those images as PNG bytes (Trajectory.images); the learner preprocesses them with the same
png_image_inputs the request was made with, re-encodes them in its packed forward, and every lag-0 token's
log-prob equals the engine's behavior log-prob exactly (assert_lag0_exact), and the step updates the vision
tower too. Negative control: on the standard op set the same step measures a non-zero lag-0 |dlogp|."""

import numpy as np
import pytest
import torch
from PIL import Image

from rz_agents.images import to_png
from rz_agents.model.freeze import freeze_vision_tower
from rz_agents.model.vl_processor import png_image_inputs, preprocess_images
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig
from rz_agents.trajectory import Trajectory
from tests.trainer.vl_batch import sample_vl_batch, tiny_vl_model


def _cfg(exact: bool) -> LearnerConfig:
    return LearnerConfig(optim=OptimConfig(lr=1e-2, max_grad_norm=1.0), assert_lag0_exact=exact)


def test_learner_lag0_exact_with_images_and_the_tower_trains():
    model = tiny_vl_model()
    trajs = sample_vl_batch(model)
    assert len({t.reward for t in trajs}) > 1  # a non-zero advantage somewhere: the step has a gradient
    before = model.visual.patch_embed.proj.weight.detach().clone()
    metrics = Learner(model, _cfg(exact=True)).step(trajs)
    assert metrics["lag0_abs_dlogp_max"] == 0.0 and metrics["step_skipped_nonfinite"] == 0
    assert not torch.equal(model.visual.patch_embed.proj.weight, before)


def test_negative_control_standard_kernels_measure_a_mismatch():
    model = tiny_vl_model(kernels="standard")
    trajs = sample_vl_batch(model)
    metrics = Learner(model, _cfg(exact=False)).step(trajs)
    assert 0.0 < metrics["lag0_abs_dlogp_max"] < 1e-3


def test_png_round_trip_gives_the_engine_and_the_learner_the_same_pixel_values():
    """What the rollout sent (the image as the env rendered it) and what the learner re-derives from the
    trajectory's PNG bytes are the same tensors, bit for bit (PNG is lossless; one preprocessing)."""
    vision = tiny_vl_model().vl_config.vision
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(40, 72), (64, 64), (33, 50)]]
    direct_pixels, direct_grids = preprocess_images([Image.fromarray(a) for a in images], vision)
    pixels, grids = png_image_inputs([to_png(a) for a in images], vision)
    assert torch.equal(pixels, direct_pixels) and torch.equal(grids, direct_grids)
    # negative control: a one-level change of one pixel changes the pixel values
    images[1][3, 5, 0] ^= 1
    changed, _ = png_image_inputs([to_png(a) for a in images], vision)
    assert not torch.equal(changed, pixels)


def test_a_text_model_refuses_trajectories_with_images():
    from rz_agents.model import ModelConfig, Transformer
    from rz_agents.trainer.sequence_logprobs import trajectory_logprobs

    png = to_png(np.zeros((32, 32, 3), dtype=np.uint8))
    traj = Trajectory([1, 2, 3], [False, True, True], [0.0, -1.0, -1.0], [-1, 0, 0], 1.0, 0, images=[png])
    with pytest.raises(ValueError, match="no vision tower"):
        trajectory_logprobs(Transformer(ModelConfig.tiny("qwen3", vocab_size=320)), [traj], {})


def _tower_and_lm(model) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    tower = {k: v for k, v in state.items() if k.startswith("model.visual.")}
    return tower, {k: v for k, v in state.items() if k not in tower}


@pytest.mark.parametrize("freeze", [True, False])
def test_freeze_vision_keeps_the_tower_and_trains_the_language_model(freeze):
    """learner.freeze_vision: after a step every tower tensor holds its bits and no tower parameter has an
    AdamW state, while the language model moved; unfrozen (the control), the same step moves the tower."""
    model = tiny_vl_model()
    trajs = sample_vl_batch(model)
    tower0, lm0 = _tower_and_lm(model)
    cfg = LearnerConfig(optim=OptimConfig(lr=1e-2), assert_lag0_exact=True, freeze_vision=freeze)
    if freeze:  # as model.policy.build_policy does for PolicySpec.freeze_vision
        freeze_vision_tower(model)
    learner = Learner(model, cfg)
    metrics = learner.step(trajs)
    assert metrics["lag0_abs_dlogp_max"] == 0.0 and metrics["step_skipped_nonfinite"] == 0
    tower1, lm1 = _tower_and_lm(model)
    assert any(not torch.equal(lm1[k], lm0[k]) for k in lm0)
    tower_same = [torch.equal(tower1[k], tower0[k]) for k in tower0]
    tower_ids = {id(p) for p in model.visual.parameters()}
    with_state = [p for p in learner.optimizer.state if id(p) in tower_ids]
    if freeze:
        assert all(tower_same) and not with_state
        assert not any(p.requires_grad for p in model.visual.parameters())
    else:
        assert not all(tower_same) and len(with_state) == len(tower_ids)


def test_freeze_vision_on_a_text_model_is_refused():
    from rz_agents.model import ModelConfig, Transformer

    with pytest.raises(ValueError, match="freeze_vision.*no vision tower"):
        Learner(Transformer(ModelConfig.tiny("qwen3", vocab_size=320)), LearnerConfig(freeze_vision=True))


def test_vision_lr_moves_the_tower_at_its_own_rate():
    """optim.vision_lr: AdamW's first step moves each parameter with a gradient by about its group's rate
    (the update is lr * m / sqrt(v) = lr * sign(g)), so the largest change in the tower is ~vision_lr and in
    the language model ~lr."""
    model = tiny_vl_model()
    trajs = sample_vl_batch(model)
    tower0, lm0 = _tower_and_lm(model)
    cfg = LearnerConfig(optim=OptimConfig(lr=1e-4, vision_lr=1e-2, eps=1e-12, max_grad_norm=0.0))
    learner = Learner(model, cfg)
    assert [g["lr"] for g in learner.optimizer.param_groups] == [1e-4, 1e-2]
    assert learner.step(trajs)["step_skipped_nonfinite"] == 0
    tower1, lm1 = _tower_and_lm(model)
    tower_move = max(float((tower1[k] - tower0[k]).abs().max()) for k in tower0)
    lm_move = max(float((lm1[k] - lm0[k]).abs().max()) for k in lm0)
    assert tower_move == pytest.approx(1e-2, rel=0.01) and lm_move == pytest.approx(1e-4, rel=0.01)


def test_vision_lr_needs_a_trained_tower():
    model = tiny_vl_model()
    freeze_vision_tower(model)
    with pytest.raises(ValueError, match="vision_lr.*no trained vision tower"):
        Learner(model, LearnerConfig(optim=OptimConfig(vision_lr=1e-3), freeze_vision=True))


def test_freeze_vision_refuses_a_tower_that_trains():
    """The policy builder freezes the tower (PolicySpec.freeze_vision); the learner does not freeze it a
    second time: given a model whose tower still trains it refuses, naming the builder."""
    with pytest.raises(
        ValueError, match="freeze_vision is set but the model's vision tower trains.*build_policy"
    ):
        Learner(tiny_vl_model(), LearnerConfig(freeze_vision=True))
