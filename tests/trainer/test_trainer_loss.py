"""The REINFORCE Zero loss and each comparison estimator against hand-computed values and gradients."""

import math

import pytest
import torch

from rz_agents.trainer.advantages import group_advantages
from rz_agents.trainer.loss import (
    ESTIMATOR_TABLE,
    ESTIMATORS,
    LossConfig,
    m2po_keep,
    sequence_loss,
    sequence_terms,
    token_scales,
)


def _loss_and_grad(logp_vals, blp_vals, mask_vals, adv, cfg, scale=None):
    logp = torch.tensor(logp_vals, dtype=torch.float32, requires_grad=True)
    blp = torch.tensor(blp_vals, dtype=torch.float32)
    mask = torch.tensor(mask_vals, dtype=torch.bool)
    if scale is None:
        scale = token_scales([mask], cfg.normalization)[0]
    loss = sequence_loss(logp, blp, mask, adv, scale, cfg)
    loss.backward()
    return float(loss.detach()), logp.grad.tolist()


def test_reinforce_zero_value_and_gradient_match_hand_computation():
    # w = [e^0.5, 1, (masked)], A = 0.5, token normalizer = 2 sampled tokens.
    loss, grad = _loss_and_grad([-1.0, -2.0, -3.0], [-1.5, -2.0, 0.0], [True, True, False], 0.5, LossConfig())
    w0 = math.exp(0.5)
    assert loss == pytest.approx(-(w0 * 0.5 + 1.0 * 0.5) / 2, rel=1e-6)
    # d/dlogp of -(w A)/2 is -(w A)/2: the gradient flows through the unclipped weight.
    assert grad == pytest.approx([-w0 * 0.5 / 2, -0.5 / 2, 0.0], rel=1e-6)


def test_reinforce_zero_does_not_clip_large_ratios():
    loss, grad = _loss_and_grad([-0.1], [-5.1], [True], 1.0, LossConfig())
    assert loss == pytest.approx(-math.exp(5.0), rel=1e-5)
    assert grad == pytest.approx([-math.exp(5.0)], rel=1e-5)


def test_the_retired_standard_is_name_is_refused_with_what_to_write():
    with pytest.raises(ValueError, match="model.kernels: standard"):
        LossConfig("standard_is").validate()


def test_on_policy_ignores_behavior_logprobs():
    loss, grad = _loss_and_grad([-1.0, -2.0], [-9.0, -0.1], [True, True], 2.0, LossConfig("on_policy"))
    assert loss == pytest.approx(-2.0)  # coefficient 1 per token: -(2*1 + 2*1)/2
    assert grad == pytest.approx([-1.0, -1.0])


def test_token_gate_drops_tokens_whose_weight_leaves_the_band():
    cfg = LossConfig("token_gate", gate_ratio=2.0)
    # w = [e^1 ~ 2.72 (dropped), e^0.5 ~ 1.65 (kept), e^-1 ~ 0.37 (dropped)]
    loss, grad = _loss_and_grad([-1.0, -1.0, -1.0], [-2.0, -1.5, 0.0], [True, True, True], 1.0, cfg)
    w = math.exp(0.5)
    assert loss == pytest.approx(-w / 3, rel=1e-6)
    assert grad == pytest.approx([0.0, -w / 3, 0.0], rel=1e-6)


def test_sequence_gate_keeps_or_drops_the_whole_sequence():
    cfg = LossConfig("sequence_gate", gate_ratio=2.0)
    # Geometric-mean ratio exp(mean(0.5, 0.5)) = e^0.5 < 2: kept, token weights unchanged.
    loss, grad = _loss_and_grad([-1.0, -1.0], [-1.5, -1.5], [True, True], 1.0, cfg)
    assert loss == pytest.approx(-math.exp(0.5), rel=1e-6)
    # exp(mean(1.0, 0.0)) = e^0.5 kept although one token has w = e > 2 (a token gate would drop it).
    loss, _ = _loss_and_grad([-1.0, -1.0], [-2.0, -1.0], [True, True], 1.0, cfg)
    assert loss == pytest.approx(-(math.e + 1.0) / 2, rel=1e-6)
    # exp(mean(1.0, 0.6)) = e^0.8 > 2: the whole sequence is dropped.
    loss, grad = _loss_and_grad([-1.0, -1.0], [-2.0, -1.6], [True, True], 1.0, cfg)
    assert loss == 0.0
    assert grad == [0.0, 0.0]


def test_truncated_is_caps_the_weight_in_value_and_gradient():
    cfg = LossConfig("truncated_is", truncation_cap=2.0)
    loss, grad = _loss_and_grad([-1.0, -1.0], [-2.0, 0.0], [True, True], 1.0, cfg)
    small = math.exp(-1.0)
    assert loss == pytest.approx(-(2.0 + small) / 2, rel=1e-6)
    assert grad == pytest.approx([-2.0 / 2, -small / 2], rel=1e-6)


@pytest.mark.parametrize(
    ("log_w", "adv", "value_coef", "grad_coef"),
    [
        (math.log(1.5), 1.0, 1.2, 0.0),  # A > 0, w above 1+eps: clipped, no gradient
        (math.log(0.5), 1.0, 0.5, 0.5),  # A > 0, w below 1-eps: unclipped branch is the min
        (math.log(0.5), -1.0, 0.8, 0.0),  # A < 0, w below 1-eps: clipped, no gradient
        (math.log(1.5), -1.0, 1.5, 1.5),  # A < 0, w above 1+eps: unclipped branch
        (math.log(1.1), 1.0, 1.1, 1.1),  # inside the band
    ],
)
def test_ppo_clip_matches_the_clipped_surrogate(log_w, adv, value_coef, grad_coef):
    cfg = LossConfig("ppo_clip", ppo_clip_eps=0.2)
    loss, grad = _loss_and_grad([-1.0 + log_w], [-1.0], [True], adv, cfg)
    assert loss == pytest.approx(-value_coef * adv, rel=1e-5)
    assert grad == pytest.approx([-grad_coef * adv], rel=1e-5, abs=1e-7)


def test_sequence_normalization_weighs_each_sequence_equally():
    masks = [torch.tensor([True]), torch.tensor([True, True, True])]
    tok = token_scales(masks, "token")
    seq = token_scales(masks, "sequence")
    assert [s.tolist() for s in tok] == [[0.25], [0.25, 0.25, 0.25]]
    assert [s.tolist() for s in seq] == [[0.5], pytest.approx([1 / 6] * 3)]


def test_masked_positions_contribute_nothing_even_when_non_finite():
    # A non-sampled position with an absurd behavior value must not leak into the loss.
    loss, grad = _loss_and_grad([-1.0, -1.0], [-1.0, -1e9], [True, False], 1.0, LossConfig())
    assert loss == pytest.approx(-1.0)
    assert grad == pytest.approx([-1.0, 0.0])


def test_group_mean_baseline():
    adv = group_advantages([1.0, 0.0, 0.0, 1.0, 3.0, 5.0], ["a", "a", "a", "a", "b", "b"])
    assert adv == pytest.approx([0.5, -0.5, -0.5, 0.5, -1.0, 1.0])


def test_group_leave_one_out_baseline():
    adv = group_advantages([1.0, 0.0, 0.0, 2.0, 7.0], [0, 0, 0, 1, 2], baseline="leave_one_out")
    # r_i - mean(others): 1 - 0, 0 - 0.5, 0 - 0.5; singleton groups have no baseline.
    assert adv == pytest.approx([1.0, -0.5, -0.5, 0.0, 0.0])


@pytest.mark.parametrize(
    "bad",
    [
        LossConfig(estimator="grpo"),
        LossConfig(normalization="batch"),
        LossConfig(gate_ratio=1.0),
        LossConfig(truncation_cap=0.0),
        LossConfig(ppo_clip_eps=1.5),
        LossConfig(behavior_kl_coef=-0.1),
        LossConfig(behavior_kl_coef=math.inf),
    ],
)
def test_bad_loss_config_names_the_field(bad):
    with pytest.raises(ValueError, match=r"loss\."):
        bad.validate()


@pytest.mark.parametrize("estimator", ["token_gate", "truncated_is"])
def test_gates_and_truncation_stay_finite_when_a_weight_overflows(estimator):
    # w = exp(1e4) is inf in fp32: the gate drops the token, truncation caps it; neither yields NaN.
    cfg = LossConfig(estimator, gate_ratio=2.0, truncation_cap=2.0)
    loss, grad = _loss_and_grad([-1.0, -1.0], [-1e4, -1.0], [True, True], 1.0, cfg)
    assert math.isfinite(loss) and all(math.isfinite(g) for g in grad)
    expected = [0.0, -0.5] if estimator == "token_gate" else [-1.0, -0.5]
    assert grad == pytest.approx(expected)


def test_sequence_gate_drops_a_sequence_with_an_overflowing_weight_without_nan():
    cfg = LossConfig("sequence_gate", gate_ratio=2.0)
    loss, grad = _loss_and_grad([-1.0, -1.0], [-1e4, -1.0], [True, True], 1.0, cfg)
    assert loss == 0.0 and grad == [0.0, 0.0]


# ---- the lag-tolerant estimators (issue 25) ----------------------------------------------------------------
def _terms(logp_vals, blp_vals, mask_vals, adv, cfg, aux=None, n_total=None):
    """Loss, gradient and gated-token count of one sequence under a token normalizer of n_total tokens."""
    logp = torch.tensor(logp_vals, dtype=torch.float32, requires_grad=True)
    mask = torch.tensor(mask_vals, dtype=torch.bool)
    scale = mask.float() / (n_total or int(mask.sum()))
    loss, gated = sequence_terms(logp, torch.tensor(blp_vals), mask, adv, scale, cfg, aux)
    loss.backward()
    return float(loss.detach()), logp.grad.tolist(), gated


def test_every_estimator_is_one_entry_of_the_table():
    assert set(ESTIMATORS) == set(ESTIMATOR_TABLE)
    for name in ("m2po", "icepop", "snis", "decoupled_ppo"):
        LossConfig(name).validate()


def test_icepop_masks_tokens_outside_the_ratio_band():
    cfg = LossConfig("icepop", icepop_band=3.0)
    # log w = [1.0 (w 2.72, kept), 1.2 (w 3.32 > 3, masked), -1.2 (w 0.30 < 1/3, masked)]
    loss, grad, gated = _terms([-1.0, -1.0, -1.0], [-2.0, -2.2, 0.2], [True, True, True], 2.0, cfg)
    assert loss == pytest.approx(-math.e * 2.0 / 3, rel=1e-6)
    assert grad == pytest.approx([-math.e * 2.0 / 3, 0.0, 0.0], rel=1e-6)
    assert gated == 2


def test_m2po_keeps_the_largest_low_second_moment_set_of_the_batch():
    # Log ratios over the batch: seq a [0.1, -0.5], seq b [0.2, 1.0]; squares 0.01, 0.25, 0.04, 1.0.
    # Ascending 0.01, 0.04, 0.25, 1.0 with prefix means 0.01, 0.025, 0.10, 0.325: at tau 0.04 the two
    # smallest are kept (a[0], b[0]); a[1] and b[1] push the second moment above the bound and are masked.
    logps = [torch.tensor([-1.0, -1.0]), torch.tensor([-2.0, -2.0, -2.0])]
    behavior = [torch.tensor([-1.1, -0.5]), torch.tensor([0.0, -2.2, -3.0])]
    masks = [torch.tensor([True, True]), torch.tensor([False, True, True])]  # b[0] is a prompt token
    keep = m2po_keep(logps, behavior, masks, tau=0.04)
    assert [k.tolist() for k in keep] == [[True, False], [True, True, False]]
    cfg = LossConfig("m2po", m2po_tau=0.04)
    loss, grad, gated = _terms([-1.0, -1.0], [-1.1, -0.5], [True, True], 1.0, cfg, aux=keep[0], n_total=4)
    w = math.exp(0.1)
    assert loss == pytest.approx(-w / 4, rel=1e-6) and grad == pytest.approx([-w / 4, 0.0], rel=1e-6)
    assert gated == 1
    # A looser bound keeps three (prefix mean 0.10 <= 0.11); a non-finite ratio always sorts last.
    assert (
        sum(int(k[m].sum()) for k, m in zip(m2po_keep(logps, behavior, masks, 0.11), masks, strict=True)) == 3
    )
    inf_keep = m2po_keep(
        [torch.tensor([0.0, 0.0])], [torch.tensor([-1e30, 0.0])], [torch.ones(2, dtype=torch.bool)], 1.0
    )
    assert inf_keep[0].tolist() == [False, True]


def test_snis_divides_by_the_batch_mean_weight_without_differentiating_it():
    cfg = LossConfig("snis")
    logps = [torch.tensor([-1.0, -1.0]), torch.tensor([-1.0])]
    behavior = [torch.tensor([-1.0 - math.log(2.0), -1.0]), torch.tensor([-1.0 - math.log(3.0)])]
    masks = [torch.ones(2, dtype=torch.bool), torch.ones(1, dtype=torch.bool)]
    aux = ESTIMATOR_TABLE["snis"].prepare(logps, behavior, masks, cfg)
    assert float(aux[0]) == pytest.approx(2.0)  # w = 2, 1, 3: mean 2
    loss, grad, gated = _terms([-1.0, -1.0], behavior[0].tolist(), [True, True], 1.5, cfg, aux[0], n_total=3)
    # -(sum_t w_t / 2 * A) / 3 over this sequence's w = 2, 1; gradient -(w_t / 2 * A) / 3 (denominator fixed)
    assert loss == pytest.approx(-(1.0 + 0.5) * 1.5 / 3, rel=1e-6)
    assert grad == pytest.approx([-1.0 * 1.5 / 3, -0.5 * 1.5 / 3], rel=1e-6)
    assert gated == 0


@pytest.mark.parametrize(
    ("log_v", "log_r", "adv", "value", "grad", "gated"),
    [
        (math.log(2.0), math.log(1.1), 1.0, 2.0 * 1.1, 2.0 * 1.1, 0),  # inside the band: v * r * A
        (math.log(2.0), math.log(1.5), 1.0, 2.0 * 1.2, 0.0, 1),  # A > 0, r > 1 + eps: clipped
        (math.log(2.0), math.log(1.5), -1.0, -2.0 * 1.5, -2.0 * 1.5, 0),  # A < 0: the unclipped branch
        (math.log(6.0), 0.0, 1.0, 0.0, 0.0, 1),  # behavior -> proximal weight above the cap 5: masked
    ],
)
def test_decoupled_ppo_weights_by_behavior_and_clips_against_the_proximal(
    log_v, log_r, adv, value, grad, gated
):
    cfg = LossConfig("decoupled_ppo", ppo_clip_eps=0.2, decoupled_weight_cap=5.0)
    blp = -3.0
    prox = blp + log_v
    loss, g, n = _terms([prox + log_r], [blp], [True], adv, cfg, aux=torch.tensor([prox]))
    assert loss == pytest.approx(-value, rel=1e-5) and g == pytest.approx([-grad], rel=1e-5, abs=1e-7)
    assert n == gated


def test_decoupled_ppo_with_the_current_policy_as_proximal_is_capped_unclipped_is():
    # proximal_every 1: logp_prox = sg(logp), r = 1 (never clipped); the gradient is w A grad logp
    # where w <= cap.
    cfg = LossConfig("decoupled_ppo", proximal_every=1, decoupled_weight_cap=5.0)
    loss, grad, gated = _terms([-1.0, -1.0], [-1.5, -3.0], [True, True], 1.0, cfg)
    w = math.exp(0.5)
    assert loss == pytest.approx(-w / 2, rel=1e-6) and grad == pytest.approx([-w / 2, 0.0], rel=1e-6)
    assert gated == 1  # w = e^2 = 7.4 > 5


def test_clipfrac_counts_the_clipped_tokens_of_ppo_clip_and_truncated_is():
    # w = [1.5, 0.5, 1.0]; A > 0: ppo_clip clips only the first (w > 1 + eps); truncation at C = 1.2 likewise.
    args = ([-1.0 + math.log(1.5), -1.0 + math.log(0.5), -1.0], [-1.0, -1.0, -1.0], [True, True, True], 1.0)
    assert _terms(*args, LossConfig("ppo_clip"))[2] == 1
    assert _terms(*args, LossConfig("truncated_is", truncation_cap=1.2))[2] == 1
    assert _terms(*args, LossConfig("reinforce_zero"))[2] == 0
    # geometric-mean ratio exp(-0.096) = 0.91: kept inside [1/1.2, 1.2], the whole sequence dropped by 1.05
    assert _terms(*args, LossConfig("sequence_gate", gate_ratio=1.2))[2] == 0
    assert _terms(*args, LossConfig("sequence_gate", gate_ratio=1.05))[2] == 3


@pytest.mark.parametrize(
    ("log_w", "adv", "value_coef", "grad_coef"),
    [
        (math.log(5.0), -1.0, 3.0, 0.0),  # A < 0, w above c = 3: floored at c A, no gradient
        (math.log(2.0), -1.0, 2.0, 2.0),  # A < 0, 1 + eps < w < c: ppo_clip's unclipped branch
        (math.log(0.5), -1.0, 0.8, 0.0),  # A < 0, w below 1 - eps: clipped as ppo_clip
        (math.log(5.0), 1.0, 1.2, 0.0),  # A > 0: exactly ppo_clip, whatever w
        (math.log(0.5), 1.0, 0.5, 0.5),
    ],
)
def test_dual_clip_floors_negative_advantage_tokens_at_c_times_a(log_w, adv, value_coef, grad_coef):
    cfg = LossConfig("dual_clip", ppo_clip_eps=0.2, dual_clip_c=3.0)
    loss, grad = _loss_and_grad([-1.0 + log_w], [-1.0], [True], adv, cfg)
    assert loss == pytest.approx(-value_coef * adv, rel=1e-5)
    assert grad == pytest.approx([-grad_coef * adv], rel=1e-5, abs=1e-7)


def test_dual_clip_counts_floored_tokens_and_stays_finite_when_a_weight_overflows():
    # w = [inf, 2, 1]; A < 0: the overflowing token is floored (counted, no NaN), the others pass through
    loss, grad, gated = _terms(
        [-1.0, -1.0 + math.log(2.0), -1.0], [-1e4, -1.0, -1.0], [True] * 3, -1.0, LossConfig("dual_clip")
    )
    assert math.isfinite(loss) and all(math.isfinite(g) for g in grad)
    assert gated == 1 and grad == pytest.approx([0.0, 2.0 / 3, 1.0 / 3], rel=1e-6)
    with pytest.raises(ValueError, match=r"loss\.dual_clip_c must be > 1 \+ ppo_clip_eps"):
        LossConfig("dual_clip", dual_clip_c=1.1).validate()


@pytest.mark.parametrize("estimator", ["reinforce_zero", "ppo_clip"])
def test_behavior_kl_coef_adds_half_beta_squared_log_ratio_to_any_estimator(estimator):
    # log w = [0.5, -1.0, (masked)], A = 0.5, token normalizer 2, beta = 0.4.
    logp, blp, mask = [-1.0, -3.0, -3.0], [-1.5, -2.0, 0.0], [True, True, False]
    base_loss, base_grad = _loss_and_grad(logp, blp, mask, 0.5, LossConfig(estimator))
    loss, grad = _loss_and_grad(logp, blp, mask, 0.5, LossConfig(estimator, behavior_kl_coef=0.4))
    # loss gains beta/2 * (log w)^2 / normalizer per sampled token; gradient beta * log w / normalizer.
    assert loss == pytest.approx(base_loss + 0.4 * 0.5 * (0.25 + 1.0) / 2, rel=1e-6)
    assert grad == pytest.approx([base_grad[0] + 0.4 * 0.5 / 2, base_grad[1] - 0.4 * 1.0 / 2, 0.0], rel=1e-6)


def test_behavior_kl_coef_pulls_back_a_token_the_clip_no_longer_moves():
    # ppo_clip with A > 0 and w = e^1 > 1 + eps: the clipped branch has no gradient; the term restores it.
    _, clipped = _loss_and_grad([-1.0], [-2.0], [True], 1.0, LossConfig("ppo_clip"))
    _, restored = _loss_and_grad([-1.0], [-2.0], [True], 1.0, LossConfig("ppo_clip", behavior_kl_coef=0.5))
    assert clipped == [0.0]
    assert restored == pytest.approx([0.5 * 1.0], rel=1e-6)  # descending it lowers logp toward the sampler's
