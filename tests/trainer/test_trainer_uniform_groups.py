"""rollout.skip_uniform_groups on the learner: a group whose rewards are all equal (advantage 0) is left
out of the forward/backward, and the update is still the one the whole batch gives (the loss normalizer
counts the skipped tokens; a batch of only such groups still steps AdamW, with zero gradients)."""

import torch

from rz_agents.trainer.advantages import uniform_groups
from rz_agents.trainer.learner import Learner
from tests.trainer.test_trainer_learner import _batch, _cfg, _model, _sample


def _with_uniform_group(model, reward=1.0, version=0):
    """Group 0 varies (rewards from its tokens); group 1 has reward ``reward`` for every member."""
    varied = _batch(model, version=version, groups=1, g=4)
    uniform = [_sample(model, [9, 5, 7], 6, version, 500 + j, 1, reward=reward) for j in range(4)]
    assert len({t.reward for t in varied}) > 1
    return varied + uniform


def _two_learners():
    a, b = _model(), _model()
    return a, b, Learner(a, _cfg()), Learner(b, _cfg(skip_uniform_groups=True))


def _same_weights(a, b) -> bool:
    return all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def _max_abs_diff(a, b) -> float:
    return max(
        float((x - y).abs().max())
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_uniform_groups_are_those_whose_rewards_are_all_equal():
    assert uniform_groups([1.0, 1.0, 0.0, 1.0, 0.5, 0.5], [0, 0, 1, 1, 2, 2]) == {0, 2}
    assert uniform_groups([0.0], [7]) == {7}  # a lone sample has no baseline but itself


def test_skipping_a_uniform_group_trains_fewer_tokens_to_the_same_update():
    full_model, skip_model, full, skip = _two_learners()
    batch = _with_uniform_group(full_model)
    m_full, m_skip = full.step(batch), skip.step(batch)
    assert m_full["groups_uniform"] == m_skip["groups_uniform"] == 1
    assert "groups_skipped_uniform" not in m_full
    assert m_skip["groups_skipped_uniform"] == 1 and m_skip["trajectories_skipped_uniform"] == 4
    skipped = sum(len(t.tokens) for t in batch[4:])
    assert m_skip["tokens_skipped_uniform"] == skipped
    assert m_skip["learner_tokens"] == m_full["learner_tokens"] - skipped
    # the reward figures are the whole batch's
    assert m_skip["reward_mean"] == m_full["reward_mean"]
    assert m_skip["lag0_abs_dlogp_max"] == 0.0 and skip.version == full.version == 1
    # Same update, bit for bit (one micro-batch): the skipped sequences add exact zeros to the gradient sums.
    assert m_skip["loss"] == m_full["loss"]
    assert _same_weights(full_model, skip_model)


def test_dropping_the_group_from_the_batch_instead_changes_the_update():
    """Negative control: leaving the group out of the batch (and so out of the token normalizer) gives a
    different, larger step; the skip is not that."""
    full_model, dropped_model, full, dropped = _two_learners()
    batch = _with_uniform_group(full_model)
    dropped.cfg.skip_uniform_groups = False
    full.step(batch)
    dropped.step(batch[:4])
    assert _max_abs_diff(full_model, dropped_model) > 1e-4


def test_a_batch_of_only_uniform_groups_runs_no_forward_and_still_steps_adam():
    full_model, skip_model, full, skip = _two_learners()
    first = _with_uniform_group(full_model)
    full.step(first), skip.step(first)
    batch = [
        _sample(full_model, [3 + gi, 5, 7], 6, 1, 900 + 10 * gi + j, gi, reward=float(gi))
        for gi in range(2)
        for j in range(3)
    ]
    before = {k: v.clone() for k, v in skip_model.state_dict().items()}
    full.step(batch)
    m_skip = skip.step(batch)
    assert m_skip["groups_skipped_uniform"] == 2 and m_skip["learner_tokens"] == 0
    assert m_skip["time_forward_s"] == 0.0 and "lag0_abs_dlogp_max" not in m_skip
    # AdamW's momentum moves the weights on a zero gradient, as it does on the full batch
    assert any(not torch.equal(before[k], v) for k, v in skip_model.state_dict().items())
    assert skip.version == full.version == 2 and m_skip["step_skipped_nonfinite"] == 0
    assert _same_weights(full_model, skip_model)
