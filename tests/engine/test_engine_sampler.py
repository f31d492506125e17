"""The sampler draws from exp(sampling_logprobs) and records exactly that function's value."""

from __future__ import annotations

import torch

from rz_agents.engine.params import SamplingParams
from rz_agents.engine.sampler import sample
from rz_agents.model.logprobs import sampling_logprobs


def _logits(n: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 2


def test_sampler_records_the_logprob_of_the_filtered_tempered_distribution():
    logits = _logits(6)
    params = [
        SamplingParams(temperature=t, top_k=k, top_p=p)
        for t, k, p in [(0.5, 0, 1.0), (1.0, 5, 1.0), (2.0, 0, 0.7)]
    ] * 2
    gen = torch.Generator().manual_seed(0)
    tokens, values = sample(logits, params, [None] * 6, gen)
    for i, p in enumerate(params):
        expected = sampling_logprobs(logits[i : i + 1], p.temperature, p.top_k, p.top_p)[0, tokens[i]]
        assert values[i] == float(expected) and torch.isfinite(expected)


def test_sampler_never_draws_outside_the_top_k_top_p_support():
    logits = _logits(1).expand(2000, -1)
    gen = torch.Generator().manual_seed(1)
    for p in [
        SamplingParams(top_k=3),
        SamplingParams(top_p=0.3),
        SamplingParams(temperature=0.3, top_k=10, top_p=0.5),
    ]:
        support = torch.isfinite(sampling_logprobs(logits[:1], p.temperature, p.top_k, p.top_p)[0])
        tokens, _ = sample(logits, [p] * 2000, [None] * 2000, gen)
        assert support[tokens].all()


def test_sampler_frequencies_follow_the_distribution():
    logits = _logits(1, vocab=8, seed=3)
    n = 20000
    params = SamplingParams(temperature=0.8)
    tokens, _ = sample(logits.expand(n, -1), [params] * n, [None] * n, torch.Generator().manual_seed(2))
    freq = torch.bincount(torch.tensor(tokens), minlength=8).double() / n
    probs = sampling_logprobs(logits, 0.8).exp()[0].double()
    # Binomial standard error is at most 0.0036 here; 5 sigma.
    assert (freq - probs).abs().max() < 0.018


def test_sampler_greedy_takes_the_argmax_and_records_the_untempered_logprob():
    logits = _logits(4)
    params = [SamplingParams(temperature=0.0, top_k=k) for k in (0, 3, 0, 7)]
    tokens, values = sample(logits, params, [None] * 4, torch.Generator())
    assert tokens == logits.argmax(-1).tolist()
    for i, p in enumerate(params):
        assert values[i] == float(sampling_logprobs(logits[i : i + 1], 1.0, p.top_k)[0, tokens[i]])


def test_sampler_seeded_rows_do_not_depend_on_their_neighbours():
    logits = _logits(5)
    p = SamplingParams(temperature=1.0)
    alone, _ = sample(logits[2:3], [p], [torch.Generator().manual_seed(7)], torch.Generator())
    gens = [None, None, torch.Generator().manual_seed(7), None, None]
    crowded, _ = sample(logits, [p] * 5, gens, torch.Generator().manual_seed(99))
    assert crowded[2] == alone[0]


def test_sampler_frequencies_hold_across_vocabulary_blocks():
    # 3000 tokens span three CDF blocks; mass is spread so every block is drawn from.
    vocab, n = 3000, 30000
    logits = torch.full((1, vocab), -30.0)
    hot = torch.tensor([5, 1023, 1024, 2047, 2999])
    logits[0, hot] = torch.tensor([0.0, 0.5, 1.0, -0.5, 0.2])
    params = SamplingParams(temperature=1.0)
    tokens, _ = sample(logits.expand(n, -1), [params] * n, [None] * n, torch.Generator().manual_seed(4))
    freq = torch.bincount(torch.tensor(tokens), minlength=vocab).double() / n
    probs = sampling_logprobs(logits).exp()[0].double()
    assert (freq[hot] - probs[hot]).abs().max() < 0.015
    assert freq[hot].sum() > 0.999


def test_block_probabilities_by_gather_equal_the_per_row_slices():
    from rz_agents.engine.sampler import CDF_BLOCK, _block_probs

    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(5, 3 * CDF_BLOCK + 17, generator=gen)
    block = torch.tensor([0, 3, 1, 3, 2])  # block 3 is the partial last one
    assert torch.equal(_block_probs(probs, block, gather=True), _block_probs(probs, block, gather=False))


def test_the_one_copy_to_the_host_carries_tokens_and_logprobs_exactly():
    from rz_agents.engine.sampler import HostTokens

    tokens = torch.tensor([0, 151_668, 2**40 + 3])
    values = torch.tensor([-0.0, -1e-30, -87.33654], dtype=torch.float32)
    got_tokens, got_values = HostTokens(tokens, values).lists()
    assert got_tokens == tokens.tolist()
    assert torch.equal(torch.tensor(got_values, dtype=torch.float32), values)


def test_greedy_rows_sharing_a_group_with_sampled_rows_change_no_sampled_token():
    # Greedy (temperature 0 -> recorded at temperature 1) and temperature-1 rows share one group: the
    # draw runs over every row and greedy rows take the argmax; sampled rows get what they get alone.
    from rz_agents.engine.sampler import sample_on_device

    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 3000, generator=gen)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=1)] * 3
    gens = [None if p.greedy else torch.Generator().manual_seed(10 + i) for i, p in enumerate(params)]
    tokens, values = sample_on_device(logits, params, gens, torch.Generator())
    for i, p in enumerate(params):
        g = None if p.greedy else torch.Generator().manual_seed(10 + i)
        alone, alone_values = sample_on_device(logits[i : i + 1], [p], [g], torch.Generator())
        assert tokens[i] == alone[0] and torch.equal(values[i : i + 1], alone_values)
    assert torch.equal(tokens[0::2], logits[0::2].argmax(-1))
