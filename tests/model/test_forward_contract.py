"""One forward contract for every family (model/transformer.py): tokens, positions, seq ids, cache, plus the
optional rope positions and image inputs a model that ``takes_images`` accepts; one packer
(``packed_token_logprobs``) for all, the model adding its extra inputs (``packed_inputs``). A text model
refuses image inputs by name; a vision-language model packed by the one packer gives the bits it gives one
sequence at a time."""

from __future__ import annotations

import pytest
import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.logprobs import packed_token_logprobs
from rz_agents.model.qwen3_vl import Qwen3VLModel
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig
from rz_agents.model.vision import VLSequence


def _vl() -> tuple[Qwen3VLModel, torch.Tensor, torch.Tensor, torch.Tensor]:
    cfg = Qwen3VLConfig.tiny(vocab_size=320)
    model = Qwen3VLModel(cfg)
    model.reset_parameters(std=0.1, seed=4)
    v = cfg.vision
    grid = torch.tensor([[1, 4, 4]])
    n = int(grid.prod()) // v.spatial_merge_size**2
    width = v.in_channels * v.temporal_patch_size * v.patch_size**2
    pixels = torch.randn(int(grid.prod()), width, generator=torch.Generator().manual_seed(2))
    ids = [5, 6, cfg.vision_start_token_id] + [cfg.image_token_id] * n + [cfg.vision_end_token_id, 9, 10]
    return model, torch.tensor(ids), grid, pixels


def test_a_text_model_refuses_image_inputs_by_name():
    model = Transformer(ModelConfig.tiny("qwen3", vocab_size=64))
    tokens = torch.arange(6)
    assert not model.takes_images
    with pytest.raises(ValueError, match="takes no rope_positions or image inputs"):
        model(tokens, torch.arange(6), rope_positions=torch.zeros(3, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="trajectories carry images"):
        model.scored_sequence([1, 2], [b"png"], [0, 1])
    _, _, grid, pixels = _vl()
    with pytest.raises(ValueError, match="takes no images"):
        packed_token_logprobs(model, [VLSequence([1, 2, 3], grid, pixels)])
    with pytest.raises(ValueError, match="vision-language model"):
        model.image_positions([1, 2], grid)


def test_one_packer_packs_images_as_each_sequence_alone():
    """Three sequences (pixels, cached embeddings, text only) in one pack equal each packed alone, bit for
    bit (an image's encoding and a sequence's log-probs do not depend on the rest of the pack)."""
    model, ids, grid, pixels = _vl()
    with torch.no_grad():
        cached = model.encode_images(pixels, grid)
        seqs = [VLSequence(ids, grid, pixels), VLSequence(ids, grid, images=cached), VLSequence([5, 6, 7, 8])]
        packed = packed_token_logprobs(model, seqs, temperature=0.7)
        alone = [packed_token_logprobs(model, [s], temperature=0.7)[0] for s in seqs]
    assert all(torch.equal(a, b) for a, b in zip(packed, alone, strict=True))
    assert torch.equal(packed[0], packed[1])  # pixels encoded here == the cached encoding
    # negative control: the image changes the log-probs of the tokens after it
    with torch.no_grad():
        (blank,) = packed_token_logprobs(model, [VLSequence(ids, grid, torch.zeros_like(pixels))])
    assert not torch.equal(blank, packed[0])
