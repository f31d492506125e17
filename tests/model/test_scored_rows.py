"""``packed_token_logprobs(scored=...)``: only the flagged tokens' rows go through the LM head, with the
bits they get from the whole forward (the aligned op set is row-invariant); less is kept for the backward."""

import pytest
import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.logprobs import packed_token_logprobs


def _model() -> Transformer:
    model = Transformer(ModelConfig.tiny("qwen3", num_hidden_layers=2), kernels="aligned")
    model.reset_parameters(std=0.5, seed=0)  # sharp logits: a wrong row shows
    return model


def _seqs_and_flags():
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 320, (n,), generator=g) for n in (90, 7, 150)]
    # a prompt (not scored), then sampled tokens with an unscored observation in the middle
    flags = []
    for s in seqs:
        f = torch.zeros(s.numel() - 1, dtype=torch.bool)
        f[s.numel() // 3 :] = True
        f[s.numel() // 2 : s.numel() // 2 + 3] = False
        flags.append(f.tolist())
    return seqs, flags


def _saved_bytes(fn):
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return total, out


@pytest.mark.parametrize("scoring", [{}, {"temperature": 0.7, "top_k": 20}])
def test_scored_entries_have_the_full_forwards_bits_and_the_rest_are_zero(scoring):
    model = _model()
    seqs, flags = _seqs_and_flags()
    full = packed_token_logprobs(model, seqs, **scoring)
    some = packed_token_logprobs(model, seqs, **scoring, scored=flags)
    for f, a, b in zip(flags, full, some, strict=True):
        m = torch.tensor(f, dtype=torch.bool)
        assert torch.equal(b[m], a[m])  # bit for bit: the learner's lag-0 tokens stay exact
        assert not torch.equal(a[~m], torch.zeros_like(a[~m]))  # (the full forward's are not zeros)
        assert torch.equal(b[~m], torch.zeros_like(b[~m]))


def test_scored_gradients_match_and_less_is_kept_for_the_backward():
    seqs, flags = _seqs_and_flags()
    grads, saved = {}, {}
    for mode in ("full", "scored"):
        model = _model()
        kw = {"scored": flags} if mode == "scored" else {}
        saved[mode], lps = _saved_bytes(lambda model=model, kw=kw: packed_token_logprobs(model, seqs, **kw))
        masks = [torch.tensor(f, dtype=torch.float32) for f in flags]
        loss = sum((lp * m).sum() for lp, m in zip(lps, masks, strict=True))
        loss.backward()
        grads[mode] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for name, g in grads["full"].items():  # the same loss: the same gradient up to the GEMMs' row sums
        torch.testing.assert_close(grads["scored"][name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert saved["scored"] < saved["full"], saved


def test_a_scored_mask_of_the_wrong_length_is_refused():
    model = _model()
    seqs, flags = _seqs_and_flags()
    with pytest.raises(ValueError, match="flags for a 7-token sequence"):
        packed_token_logprobs(model, seqs, scored=[flags[0], flags[1] + [True], flags[2]])
    with pytest.raises(ValueError, match="2 masks for 3 sequences"):
        packed_token_logprobs(model, seqs, scored=flags[:2])
