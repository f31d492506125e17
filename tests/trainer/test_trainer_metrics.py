"""The per-step health figures of the learner metrics: the IS-weight tail and ESS/n per lag bucket."""

import math

import pytest
import torch

from rz_agents.trainer.metrics import ess_by_lag_bucket, importance_metrics


def test_share_of_weights_above_10_counts_non_finite_weights():
    log_w = torch.tensor([0.0, math.log(20.0), 1e4, math.log(5.0)])  # w = 1, 20, inf, 5
    out = importance_metrics(log_w, torch.zeros(4), torch.zeros(4, dtype=torch.long), 0)
    assert out["is_weight_frac_above_10"] == 0.5
    assert out["is_weight_max"] == pytest.approx(20.0)


def test_ess_per_lag_bucket_matches_the_kish_formula_per_bucket():
    # lag 0: w = 1, 1 -> ESS/n 1; lags 2-3: w = 1, 3 -> (4)^2 / (2 * 10) = 0.8; no token in bucket 1
    log_w = torch.tensor([0.0, 0.0, 0.0, math.log(3.0)])
    lags = torch.tensor([0, 0, 2, 3])
    out = ess_by_lag_bucket(log_w, lags, max_lag=4)
    assert out == pytest.approx(
        {"is_weight_ess_fraction_lag_0_0": 1.0, "is_weight_ess_fraction_lag_2_3": 0.8}
    )
