"""Learner log-probs for long sequences: above KEEP_LOGITS_BYTES the LM head's logits are recomputed per
chunk in the backward instead of kept; values and gradients are the same either way."""

import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.model import logprobs as lp


def _grads(model, seqs):
    model.zero_grad()
    values = lp.packed_token_logprobs(model, seqs, temperature=0.7)
    sum(v.sum() for v in values).backward()
    return [v.detach() for v in values], {n: p.grad.clone() for n, p in model.named_parameters()}


def test_recomputed_chunks_give_the_same_logprobs_and_gradients(monkeypatch):
    torch.manual_seed(0)
    model = Transformer(ModelConfig.tiny("qwen3"))
    model.reset_parameters(std=0.1, seed=0)
    seqs = [torch.randint(0, 320, (n,)) for n in (40, 25)]
    monkeypatch.setattr(lp, "LOGIT_CHUNK", 16)
    kept_values, kept_grads = _grads(model, seqs)
    calls = []
    original = lp._chunk_logprobs
    monkeypatch.setattr(lp, "_chunk_logprobs", lambda *a: calls.append(1) or original(*a))
    monkeypatch.setattr(lp, "KEEP_LOGITS_BYTES", 0)  # every call recomputes
    values, grads = _grads(model, seqs)
    chunks = -(-(39 + 24) // 16)
    assert len(calls) == 2 * chunks  # forward, then once more per chunk in the backward
    for a, b in zip(values, kept_values, strict=True):
        assert torch.equal(a, b)
    for name, g in grads.items():
        torch.testing.assert_close(g, kept_grads[name], rtol=1e-5, atol=1e-7, msg=name)
