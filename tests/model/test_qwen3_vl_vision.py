"""The Qwen3-VL vision tower is batch-invariant on the aligned op set: an image's embeddings (and deepstack
features) are the same bits whether it is encoded alone or packed with any other images, in any order
(torch.equal). Negative controls: the standard op set (stock GEMM / SDPA over images padded to the longest)
does not keep that, and attention over the whole pack as one segment changes every image.
"""

import pytest
import torch

from rz_agents.model.qwen3_vl import Qwen3VLModel
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig
from rz_agents.model.vision import ImageEmbeddings

# (t, h, w) in patches: 4 .. 192 patches (several 64-key blocks), square and not
GRIDS = [(1, 2, 2), (1, 6, 8), (1, 16, 12), (1, 4, 4), (1, 8, 2)]


def _model(dtype: str = "float32", kernels: str = "aligned") -> Qwen3VLModel:
    torch.manual_seed(0)
    model = Qwen3VLModel(Qwen3VLConfig.tiny(dtype=dtype), kernels=kernels)
    model.reset_parameters(std=0.1, seed=1)
    return model


def _pixels(grids, dim: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(t * h * w, dim, generator=gen) for t, h, w in grids]


def _encode(model, pixels, grids, order) -> dict[int, ImageEmbeddings]:
    """Encode the images `order` in one call; their embeddings by image index."""
    with torch.no_grad():
        out = model.encode_images(torch.cat([pixels[i] for i in order]), [grids[i] for i in order])
    return dict(zip(order, out.split(), strict=True))


def _same(a: ImageEmbeddings, b: ImageEmbeddings) -> bool:
    return torch.equal(a.embeds, b.embeds) and all(
        torch.equal(x, y) for x, y in zip(a.deepstack, b.deepstack, strict=True)
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_image_encoding_does_not_depend_on_the_other_images(dtype):
    model = _model(dtype)
    pixels = _pixels(GRIDS, model.vl_config.vision.patch_dim)
    alone = {i: _encode(model, pixels, GRIDS, [i])[i] for i in range(len(GRIDS))}
    for order in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0], [1, 3, 1], [3, 2, 4, 0, 1]):
        packed = _encode(model, pixels, GRIDS, order)
        for i in order:
            assert _same(packed[i], alone[i]), (dtype, order, i)
    assert alone[0].embeds.shape == (1, model.config.hidden_size)
    assert len(alone[2].deepstack) == 2 and alone[2].deepstack[0].shape == (48, model.config.hidden_size)


def test_negative_control_standard_kernels_depend_on_the_batch():
    model = _model(kernels="standard")
    pixels = _pixels(GRIDS, model.vl_config.vision.patch_dim)
    alone = {i: _encode(model, pixels, GRIDS, [i])[i] for i in range(len(GRIDS))}
    packed = _encode(model, pixels, GRIDS, [2, 1, 0, 3, 4])
    assert not all(_same(packed[i], alone[i]) for i in range(len(GRIDS)))
    aligned = _model()
    ref = _encode(aligned, pixels, GRIDS, [0])[0]
    assert (ref.embeds - alone[0].embeds).abs().max() < 1e-4  # same model, other rounding only


def test_negative_control_one_segment_for_the_pack_mixes_images():
    """The per-image segmentation is what isolates images: one segment over two images changes both."""
    model = _model()
    grids = [(1, 4, 4), (1, 4, 4)]
    pixels = _pixels(grids, model.vl_config.vision.patch_dim, seed=3)
    two = _encode(model, pixels, grids, [0, 1])
    with torch.no_grad():
        merged = model.encode_images(torch.cat(pixels), [(1, 8, 4)])  # same patches, one 'image'
    first = merged.embeds[:4]
    assert not torch.equal(first, two[0].embeds)


def test_bad_vision_inputs_name_the_problem():
    model = _model()
    dim = model.vl_config.vision.patch_dim
    with pytest.raises(ValueError, match="pixel_values must be"):
        model.encode_images(torch.zeros(4, dim + 1), [(1, 2, 2)])
    with pytest.raises(ValueError, match="describes 8"):
        model.encode_images(torch.zeros(4, dim), [(1, 2, 4)])
    with pytest.raises(ValueError, match="multiples of merge size"):
        model.encode_images(torch.zeros(3, dim), [(1, 1, 3)])
