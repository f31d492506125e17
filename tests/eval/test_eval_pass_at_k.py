"""avg@k and the unbiased pass@k estimator against hand-computed values."""

import pytest

from rz_agents.eval.pass_at_k import avg_at_k, mean_pass_at_k, pass_at_k


def test_pass_at_k_matches_hand_computed_binomials():
    # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k = 1 is the fraction correct
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    # 1 - C(6,3)/C(8,3) = 1 - 20/56
    assert pass_at_k(8, 2, 3) == pytest.approx(1 - 20 / 56)
    # fewer wrong samples than k: every draw holds a correct one
    assert pass_at_k(4, 2, 3) == 1.0


def test_pass_at_k_with_n_equal_k_is_any_correct():
    assert pass_at_k(16, 0, 16) == 0.0
    assert pass_at_k(16, 1, 16) == 1.0
    assert pass_at_k(16, 16, 16) == 1.0


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (4, 5, 2), (4, -1, 2), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_avg_at_k_is_the_mean_of_per_problem_accuracy():
    samples = [[1, 0, 0, 1], [0, 0, 0, 0], [True, True, True, True]]
    assert avg_at_k(samples) == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert mean_pass_at_k(samples, 4) == pytest.approx(2 / 3)
    # pass@2 from 4 samples: problem 1 gives 1 - C(2,2)/C(4,2) = 5/6
    assert mean_pass_at_k(samples, 2) == pytest.approx((5 / 6 + 0 + 1) / 3)


def test_avg_at_k_needs_samples():
    with pytest.raises(ValueError):
        avg_at_k([])
    with pytest.raises(ValueError, match="problem 1"):
        avg_at_k([[1], []])
