"""The KL-steered learning-rate scale: its rule by hand, and the learner stepping at the scaled rate."""

import math

import pytest
import torch

from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.lr_control import KLLrController, LrControlConfig
from rz_agents.trainer.optim import OptimConfig
from tests.trainer.learner_state import restore_whole_state, whole_state
from tests.trainer.test_trainer_learner import _batch, _model


def test_the_scale_shrinks_above_the_band_grows_below_it_and_holds_inside():
    c = KLLrController(LrControlConfig(kl_target=0.1, band=2.0, factor=2.0, min_scale=0.25))
    # above 0.2: halve, floored at 0.25; inside [0.05, 0.2]: hold; below 0.05: double, capped at 1
    assert [c.update(kl) for kl in (0.3, 0.21, 0.5, 0.1, 0.2, 0.05, 0.01, 0.0, 0.0)] == [
        0.5,
        0.25,
        0.25,
        0.25,
        0.25,
        0.25,
        0.5,
        1.0,
        1.0,
    ]


def test_the_lr_lag_budget_caps_lr_times_lag_and_leaves_a_small_enough_rate_alone():
    c = KLLrController(LrControlConfig(lr_lag_budget=1.6e-3))
    assert c.enabled
    # at lr 2e-4: untouched up to lag 8, then 8 / lag
    scales = [c.update(None, lag, 2e-4) for lag in (0.0, 2.0, 8.0, 16.0, 64.0)]
    assert scales == pytest.approx([1.0, 1.0, 1.0, 0.5, 0.125], rel=1e-12)
    assert scales[:3] == [1.0, 1.0, 1.0]  # exactly: the rate is the configured one there
    assert c.update(None, 64.0, 2.5e-5) == 1.0  # lr * lag = 1.6e-3: already within the budget
    assert c.update(None, None, 2e-4) == 1.0 and c.update(None, 64.0, None) == 1.0
    both = KLLrController(LrControlConfig(kl_target=0.1, band=2.0, factor=2.0, lr_lag_budget=1.6e-3))
    assert both.update(1.0, 64.0, 2e-4) == pytest.approx(0.5 * 0.125, rel=1e-12)  # the two parts multiply
    assert both.scale == 0.5  # only the KL part is carried to the next step


def test_off_or_without_a_measurement_the_scale_stays_one():
    off = KLLrController(LrControlConfig())
    assert not off.enabled and off.update(10.0) == 1.0
    on = KLLrController(LrControlConfig(kl_target=0.1))
    assert on.update(None) == 1.0 and on.update(math.nan) == 1.0 and on.update(math.inf) == 1.0


@pytest.mark.parametrize(
    "bad",
    [
        LrControlConfig(kl_target=0.0),
        LrControlConfig(kl_target=-1.0),
        LrControlConfig(kl_target=math.nan),
        LrControlConfig(band=1.0),
        LrControlConfig(factor=0.5),
        LrControlConfig(min_scale=0.0),
        LrControlConfig(min_scale=2.0),
        LrControlConfig(lr_lag_budget=0),
        LrControlConfig(lr_lag_budget=math.inf),
    ],
)
def test_bad_lr_control_config_names_the_field(bad):
    with pytest.raises(ValueError, match=r"lr_control\."):
        bad.validate()


def _cfg(kl_target):
    return LearnerConfig(
        optim=OptimConfig(lr=1e-2, max_grad_norm=1.0),
        lr_control=LrControlConfig(kl_target=kl_target, factor=2.0),
    )


def test_the_learner_steps_at_the_scaled_rate_and_the_update_shrinks_with_it():
    # The same stale batch (sampled at version 0, trained after one step) under a KL target far below its
    # KL: the second step runs at lr / 2 and moves the weights less than without the controller.
    moves, lrs = {}, {}
    for target in (None, 1e-9):
        model = _model()
        learner = Learner(model, _cfg(target))
        first, stale = _batch(model, version=0), _batch(model, version=0, seed=1)
        learner.step(first)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        m = learner.step(stale)
        assert m["kl_k3_behavior_to_learner"] > 1e-9
        lrs[target] = m["lr"]
        moves[target] = sum(float((model.state_dict()[k] - v).abs().sum()) for k, v in before.items())
        assert ("lr_scale" in m) == (target is not None)
    # the first (lag-0) step's KL is 0: the scale stays at its cap 1; the stale step's KL halves it
    assert lrs[None] == pytest.approx(1e-2) and lrs[1e-9] == pytest.approx(1e-2 / 2)
    assert 0.0 < moves[1e-9] < moves[None]


def test_the_scale_is_saved_and_restored_with_the_learner(tmp_path):
    model = _model()
    learner = Learner(model, _cfg(1e-9))
    first, stale = _batch(model, version=0), _batch(model, version=0, seed=1)  # both sampled at version 0
    learner.step(first)
    learner.step(stale)
    state = whole_state(learner)
    fresh = Learner(_model(seed=1), _cfg(1e-9))
    restore_whole_state(fresh, state)
    assert fresh.lr_control.scale == learner.lr_control.scale < 1.0
    old = {k: v for k, v in state.items() if k != "lr_control"}  # a checkpoint from before the controller
    restore_whole_state(fresh, old)
    assert fresh.lr_control.scale == 1.0
    fresh.load_state(learner.save_state(tmp_path / "learner"), tmp_path / "learner")  # the DCP format
    assert fresh.lr_control.scale == learner.lr_control.scale
    assert torch.equal(next(iter(fresh.model.parameters())), next(iter(learner.model.parameters())))


def test_within_the_lr_lag_budget_the_weights_are_bit_for_bit_the_recipes_and_outside_it_they_differ():
    # lr 1e-2 and a batch one version stale: lr * lag = 1e-2. A budget of exactly that leaves the run the
    # recipe's own, bit for bit (the option costs nothing where the lag is small enough, as at lag 2 or at lr
    # 2.5e-5 on the demo); half of it scales the stale step down, so the weights differ (negative control).
    weights = {}
    for budget in (None, 1e-2, 5e-3):
        model = _model()
        cfg = LearnerConfig(
            optim=OptimConfig(lr=1e-2, max_grad_norm=1.0), lr_control=LrControlConfig(lr_lag_budget=budget)
        )
        learner = Learner(model, cfg)
        first, stale = _batch(model, version=0), _batch(model, version=0, seed=1)
        learner.step(first)
        m = learner.step(stale)
        weights[budget] = [p.detach().clone() for p in model.parameters()]
        assert m["lr"] == pytest.approx(1e-2 if budget != 5e-3 else 5e-3)
    assert all(torch.equal(a, b) for a, b in zip(weights[None], weights[1e-2], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(weights[None], weights[5e-3], strict=True))
