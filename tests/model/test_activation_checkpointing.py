"""Activation checkpointing: same forward bits and gradient bits, far less kept for the backward."""

import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.logprobs import packed_token_logprobs


def _model(checkpointing: bool) -> Transformer:
    cfg = ModelConfig.tiny("qwen3", num_hidden_layers=3, activation_checkpointing=checkpointing)
    model = Transformer(cfg)
    model.reset_parameters(std=0.1, seed=0)
    return model


def _saved_bytes(fn) -> tuple[int, object]:
    """Bytes of the tensors autograd keeps for the backward while fn() runs (outside checkpoints)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return total, out


def test_checkpointing_keeps_forward_bits_and_gradients_and_saves_far_less():
    seqs = [torch.randint(0, 320, (n,), generator=torch.Generator().manual_seed(n)) for n in (300, 41, 600)]
    grads, logps, saved = {}, {}, {}
    for ckpt in (False, True):
        model = _model(ckpt)
        saved[ckpt], lps = _saved_bytes(lambda model=model: packed_token_logprobs(model, seqs))
        torch.cat(lps).sum().backward()
        logps[ckpt] = torch.cat(lps).detach()
        grads[ckpt] = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert torch.equal(logps[True], logps[False])  # the forward values never change
    for name, g in grads[False].items():  # the recompute runs the same ops: the same gradient bits
        assert torch.equal(grads[True][name], g), name
    assert saved[True] * 4 < saved[False], saved


def test_checkpointing_switch_is_off_by_default_and_not_written_to_hf_config():
    cfg = ModelConfig.tiny("qwen3")
    assert cfg.activation_checkpointing is False
    assert "activation_checkpointing" not in cfg.replace(activation_checkpointing=True).to_hf()


def test_a_trained_vision_tower_recomputes_its_blocks_with_the_same_bits_and_keeps_less():
    from rz_agents.model.qwen3_vl import Qwen3VLModel
    from rz_agents.model.qwen3_vl_config import Qwen3VLConfig

    grids = [(1, 6, 8), (1, 4, 4)]
    grads, out, saved = {}, {}, {}
    for ckpt in (False, True):
        model = Qwen3VLModel(Qwen3VLConfig.tiny(activation_checkpointing=ckpt))
        model.reset_parameters(std=0.1, seed=1)
        dim = model.vl_config.vision.patch_dim
        pixels = torch.randn(
            sum(t * h * w for t, h, w in grids), dim, generator=torch.Generator().manual_seed(2)
        )
        saved[ckpt], emb = _saved_bytes(lambda model=model, pixels=pixels: model.encode_images(pixels, grids))
        loss = emb.embeds.square().sum() + sum(d.square().sum() for d in emb.deepstack)
        loss.backward()
        out[ckpt] = torch.cat([emb.embeds, *emb.deepstack]).detach()
        grads[ckpt] = {n: p.grad.clone() for n, p in model.visual.named_parameters()}
    assert torch.equal(out[True], out[False])
    assert grads[False] and all(torch.equal(grads[True][n], g) for n, g in grads[False].items())
    # the 3 blocks' activations go; the patch embedding's, the position taps' and the mergers' stay (~51%)
    assert saved[True] < 0.6 * saved[False], saved
    model.visual.requires_grad_(False)  # frozen (learner.freeze_vision): nothing to recompute, no graph kept
    assert _saved_bytes(lambda: model.encode_images(pixels, grids))[0] == 0
