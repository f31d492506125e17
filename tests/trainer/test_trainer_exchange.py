"""The learner's exchange tensor: named views over one flat layout, summed once over ranks."""

import pytest
import torch

from rz_agents.trainer.exchange import StepExchange


def test_views_read_back_what_was_written_by_name():
    ex = StepExchange([3, 5, 2], "cpu", num_losses=2, with_counters=True)
    assert ex.flat.shape == (2 + 4 + 1 + 2 + 2,)
    ex.put_logps(0, torch.tensor([-1.0, -2.0]))
    ex.put_logps(1, torch.tensor([-0.5, -0.25, -0.125, -4.0]))
    ex.put_logps(2, torch.tensor([-3.0]))
    ex.put_loss(0, torch.tensor(1.5))
    ex.put_loss(1, torch.tensor(2.25))
    ex.add_gated(torch.tensor(3))
    ex.add_gated(0)
    ex.add_nonfinite(torch.tensor(float("nan")))
    ex.add_nonfinite(torch.tensor(1.0))
    ex.exchange(lambda t: t)
    assert torch.equal(ex.logps(1), torch.tensor([-0.5, -0.25, -0.125, -4.0]))
    assert [lp.tolist() for lp in ex.all_logps()] == [[-1.0, -2.0], [-0.5, -0.25, -0.125, -4.0], [-3.0]]
    assert ex.loss() == 3.75 and ex.gated == 3 and ex.nonfinite == 1


def test_two_ranks_writing_their_own_micro_batches_sum_to_the_whole_step():
    """Each rank fills only its share (zeros elsewhere); the sum over ranks is the one-process layout."""
    lengths = [4, 3]
    full = StepExchange(lengths, "cpu", num_losses=2, with_counters=True)
    ranks = [StepExchange(lengths, "cpu", num_losses=2, with_counters=True) for _ in range(2)]
    logps = [torch.tensor([-0.1, -0.2, -0.3]), torch.tensor([-0.7, -0.9])]
    for j, ex in enumerate([full, full]):
        ex.put_logps(j, logps[j])
        ex.put_loss(j, torch.tensor(0.5 + j))
    for j, ex in enumerate(ranks):
        ex.put_logps(j, logps[j])
        ex.put_loss(j, torch.tensor(0.5 + j))
    full.exchange(lambda t: t)
    ranks[0].exchange(lambda t: ranks[0].flat + ranks[1].flat)
    assert torch.equal(ranks[0].host, full.host)
    assert ranks[0].loss() == full.loss() == 2.0


def test_reading_before_the_exchange_is_an_error():
    ex = StepExchange([2], "cpu")
    with pytest.raises(RuntimeError, match="before exchange"):
        ex.logps(0)
