"""Shared fixtures for the engine tests: tiny random models and a pinned thread count."""

from __future__ import annotations

import pytest
import torch

from rz_agents.model import ModelConfig, Transformer

# Tests pin one thread: the engine pins it too (results can differ by thread count), and on a
# shared 2-core machine one thread avoids OpenMP oversubscription stalls.
THREADS = 1


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    yield
    torch.set_num_threads(before)


def _tiny_model(
    model_type: str = "qwen3", kernels: str = "aligned", seed: int = 0, **overrides
) -> Transformer:
    """A small random model: hidden 64, 2 layers, vocab 320 (ModelConfig.tiny)."""
    cfg = ModelConfig.tiny(model_type, **overrides)
    model = Transformer(cfg, kernels=kernels)
    model.reset_parameters(std=0.05, seed=seed)
    return model.eval()


def _perturbed_state(model: Transformer, seed: int, scale: float = 0.02) -> dict[str, torch.Tensor]:
    """A different set of weights for the same model (what a learner step would send)."""
    gen = torch.Generator().manual_seed(seed)
    return {
        name: p.detach() + scale * torch.randn(p.shape, generator=gen).to(p.dtype)
        for name, p in model.named_parameters()
    }


@pytest.fixture
def tiny_model():
    """Factory: tiny_model(model_type="qwen3", kernels="aligned", seed=0, **config_overrides)."""
    return _tiny_model


@pytest.fixture
def perturbed_state():
    """Factory: perturbed_state(model, seed, scale=0.02) -> new state dict for the same model."""
    return _perturbed_state


def _vl_learner_logprobs(model, requests, completions) -> list[torch.Tensor]:
    """The learner's log-probs of each completion's tokens: one packed forward over every (prompt, images)
    request followed by its completion, the images re-encoded (model/qwen3_vl.py: packed_logprobs)."""
    from rz_agents.model.qwen3_vl import VLSequence, packed_logprobs

    seqs = [
        VLSequence(p + c.tokens, im.image_grid_thw, im.pixel_values)
        for (p, im), c in zip(requests, completions, strict=True)
    ]
    with torch.no_grad():
        lps = packed_logprobs(model, seqs)
    return [lp[len(p) - 1 :] for lp, (p, _) in zip(lps, requests, strict=True)]


@pytest.fixture
def vl_learner():
    """Function: vl_learner(model, [(prompt, ImagePrompt)], completions) -> the learner's log-probs."""
    return _vl_learner_logprobs
