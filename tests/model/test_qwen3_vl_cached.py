"""Qwen3-VL with images encoded once and passed in (what an engine caches per sequence) gives the same bits as
encoding them inline; the cached-inference path (paged KV cache, chunked prefill cutting through an image,
then single-token decode) equals the packed training forward bit for bit, image tokens included. Negative
control: the standard op set does not.
"""

import pytest
import torch

from rz_agents.model.alignment import check_model
from rz_agents.model.kv_cache import KVCache, pages_for
from rz_agents.model.mrope import mrope_positions
from rz_agents.model.qwen3_vl import Qwen3VLModel, VLSequence, packed_logprobs, sequence_logprobs
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig, VisionConfig
from rz_agents.model.vision import ImageEmbeddings
from rz_kernels import gather_logprobs, sampling_logprobs

IMG, START, END = 300, 302, 303


def _model(kernels: str = "aligned", dtype: str = "float32") -> Qwen3VLModel:
    model = Qwen3VLModel(Qwen3VLConfig.tiny(dtype=dtype), kernels=kernels)
    model.reset_parameters(std=0.1, seed=2)
    return model


def _sequence(grids, seed: int, text=(5, 6, 7)) -> tuple[list[int], torch.Tensor]:
    """Tokens with one <start><pad x n><end> block per image between text, and the images' pixels."""
    gen = torch.Generator().manual_seed(seed)
    tokens = list(text)
    for i, (t, h, w) in enumerate(grids):
        tokens += [START] + [IMG] * (t * h * w // 4) + [END] + [10 + i, 11 + i]
    pixels = torch.randn(sum(t * h * w for t, h, w in grids), 3 * 2 * 8 * 8, generator=gen)
    return tokens, pixels


def test_cached_image_embeddings_equal_inline_encoding():
    model = _model()
    grids = [(1, 4, 6), (1, 2, 2)]
    tokens, pixels = _sequence(grids, seed=0)
    with torch.no_grad():
        inline_logits, inline = sequence_logprobs(model, tokens, pixels, grids)
        # each image encoded in its own call (an engine encoding screenshots as they arrive), then cached
        first = model.encode_images(pixels[:24], grids[:1])
        second = model.encode_images(pixels[24:], grids[1:])
        cached_logits, cached = sequence_logprobs(model, tokens, image_grid_thw=grids,
                                                  images=ImageEmbeddings.cat([first, second]))  # fmt: skip
        other_tokens, other_pixels = _sequence([(1, 2, 4)], seed=1)
        packed = packed_logprobs(
            model,
            [
                VLSequence(other_tokens, [(1, 2, 4)], other_pixels),
                VLSequence(tokens, grids, images=ImageEmbeddings.cat([first, second])),
                VLSequence([5, 6, 7, 8]),
            ],
        )
    assert torch.equal(cached_logits, inline_logits) and torch.equal(cached, inline)
    assert torch.equal(packed[1], inline)
    with torch.no_grad():
        _, alone = sequence_logprobs(model, other_tokens, other_pixels, [(1, 2, 4)])
    assert torch.equal(packed[0], alone)


def _cached_run(model, tokens, rope, images, cut: int, page_table) -> torch.Tensor:
    """Prefill tokens[:cut] in two chunks (the split inside an image), then decode the rest one by one;
    per-token log-probs of tokens[1:]."""
    cache = KVCache(model.config, num_pages=8)
    img_slots = [i for i, t in enumerate(tokens) if t == IMG]
    ids = torch.tensor(tokens)
    logps = []
    bounds = [(0, cut // 2), (cut // 2, cut)] + [(p, p + 1) for p in range(cut, len(tokens))]
    for a, b in bounds:
        rows = torch.tensor([k for k, s in enumerate(img_slots) if a <= s < b], dtype=torch.long)
        part = images.rows(rows) if rows.numel() else None
        pos = torch.arange(a, b)
        decode = (a,) if b - a == 1 else None
        view = cache.view(page_table, max_position=b - 1, decode_positions=decode)
        with torch.no_grad():
            hidden = model(ids[a:b], pos, torch.zeros(b - a, dtype=torch.long), kv_cache=view,
                           rope_positions=rope[:, a:b], images=part)  # fmt: skip
            lp = gather_logprobs(sampling_logprobs(model.logits(hidden), 1.0, 0, 1.0), ids[a + 1 : b + 1])
        logps.append(lp[: len(ids[a + 1 : b + 1])])
    return torch.cat(logps)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_chunked_prefill_and_decode_equal_the_training_forward(dtype):
    model = _model(dtype=dtype)
    model.fuse_projections()  # the engine's stacked q/k/v and gate/up GEMMs
    grids = [(1, 8, 6), (1, 2, 4)]
    tokens, pixels = _sequence(grids, seed=4)
    tokens += [20, 21, 22, 23]  # the "sampled" tail, decoded one token at a time
    rope, _ = model.rope_positions(tokens, grids)
    with torch.no_grad():
        images = model.encode_images(pixels, grids)
        (train,) = packed_logprobs(model, [VLSequence(tokens, grids, pixels)])
    cut = len(tokens) - 4
    table = torch.tensor([[5, 2]])  # pages out of order
    assert pages_for(len(tokens)) <= 2
    engine = _cached_run(model, tokens, rope, images, cut, table)
    assert torch.equal(engine, train)
    # decode rope positions continue after the images at index + delta
    _, delta = model.rope_positions(tokens[:cut], grids)
    assert rope[:, cut:].tolist() == [[p + delta for p in range(cut, len(tokens))]] * 3


def test_negative_control_standard_kernels_cached_path_differs():
    model = _model(kernels="standard")
    grids = [(1, 8, 6), (1, 2, 4)]
    tokens, pixels = _sequence(grids, seed=4)
    tokens += [20, 21, 22, 23]
    rope, _ = model.rope_positions(tokens, grids)
    with torch.no_grad():
        images = model.encode_images(pixels, grids)
        (train,) = packed_logprobs(model, [VLSequence(tokens, grids, pixels)])
    engine = _cached_run(model, tokens, rope, images, len(tokens) - 4, torch.tensor([[5, 2]]))
    assert not torch.equal(engine, train)
    assert (engine - train).abs().max() < 1e-3


def test_gradients_reach_the_vision_tower_and_can_be_frozen():
    model = _model()
    grids = [(1, 2, 4)]
    tokens, pixels = _sequence(grids, seed=5)
    (lp,) = packed_logprobs(model, [VLSequence(tokens, grids, pixels)])
    lp.sum().backward()
    assert model.visual.patch_embed.proj.weight.grad.abs().sum() > 0
    assert model.visual.deepstack_merger_list[0].linear_fc2.weight.grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)
    model.visual.requires_grad_(False)
    (lp,) = packed_logprobs(model, [VLSequence(tokens, grids, pixels)])
    lp.sum().backward()
    assert model.visual.patch_embed.proj.weight.grad is None
    assert model.model.language_model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0


def test_3d_positions_of_images_and_text():
    # text 0..2, image (2x3 merged) at 3 + (t, h, w), text resumes at 3 + max(2, 3) = 6
    pos, delta = mrope_positions([1, 2, 3] + [IMG] * 6 + [4, 5], [(1, 4, 6)], IMG, 2)
    assert pos[:, :3].tolist() == [[0, 1, 2]] * 3
    assert pos[0, 3:9].tolist() == [3] * 6
    assert pos[1, 3:9].tolist() == [3, 3, 3, 4, 4, 4]
    assert pos[2, 3:9].tolist() == [3, 4, 5, 3, 4, 5]
    assert pos[:, 9:].tolist() == [[6, 7]] * 3 and delta == 8 - 11
    with pytest.raises(ValueError, match="needs 6 consecutive image tokens"):
        mrope_positions([IMG] * 5 + [1], [(1, 4, 6)], IMG, 2)
    with pytest.raises(ValueError, match="2 image grids given"):
        mrope_positions([IMG] * 6, [(1, 4, 6), (1, 2, 2)], IMG, 2)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="mrope_section"):
        Qwen3VLConfig(Qwen3VLConfig.tiny().text, VisionConfig(out_hidden_size=64), [1, 1, 1])
    with pytest.raises(ValueError, match="out_hidden_size"):
        Qwen3VLConfig(Qwen3VLConfig.tiny().text, VisionConfig(out_hidden_size=32), [2, 3, 3])
    with pytest.raises(ValueError, match="deepstack_visual_indexes"):
        VisionConfig(depth=2, deepstack_visual_indexes=[2])
    with pytest.raises(ValueError, match="num_position_embeddings"):
        VisionConfig(num_position_embeddings=15)
    cfg = Qwen3VLConfig.tiny()
    assert Qwen3VLConfig.from_hf(cfg.to_hf()) == cfg
    model = _model()
    with pytest.raises(ValueError, match="image placeholder tokens but"):
        model(torch.tensor([IMG, IMG, 1]), torch.arange(3),
              images=ImageEmbeddings(torch.zeros(1, 64), (), (1,)))  # fmt: skip


def test_alignment_suite_passes_on_text_through_the_multimodal_model():
    """`rz align-check`'s suite (padded and packed training forwards vs random cache pages, chunked prefill
    and decode) on the Qwen3-VL decoder with text: its 3D RoPE of text equals plain RoPE's path."""
    report = check_model(_model(), seed=0, batch_sizes=(2, 3), max_len=40)
    assert report.tokens_checked > 500 and report.bit_identical, report.failures


def test_config_reads_a_transformers_4_style_config_json():
    """The published Qwen3-VL-2B-Instruct layout (transformers 4.57: rope_theta beside rope_scaling)."""
    d = {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "tie_word_embeddings": True,
        "text_config": {
            "model_type": "qwen3_vl_text", "vocab_size": 151936, "hidden_size": 2048,
            "intermediate_size": 6144,
            "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
            "rms_norm_eps": 1e-06, "rope_theta": 5000000, "max_position_embeddings": 262144,
            "rope_scaling": {
                "mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"
            },
            "dtype": "bfloat16", "tie_word_embeddings": True,
        },
        "vision_config": {
            "model_type": "qwen3_vl", "depth": 24, "hidden_size": 1024, "intermediate_size": 4096,
            "num_heads": 16, "out_hidden_size": 2048, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "num_position_embeddings": 2304, "in_channels": 3,
            "deepstack_visual_indexes": [5, 11, 17], "hidden_act": "gelu_pytorch_tanh",
        },
    }  # fmt: skip
    cfg = Qwen3VLConfig.from_hf(d)
    assert cfg.text.rope_theta == 5_000_000.0 and cfg.mrope_section == [24, 20, 20]
    assert cfg.text.tie_word_embeddings and cfg.text.dtype == "bfloat16" and cfg.text.qk_norm
    assert cfg.vision.head_dim == 64 and cfg.vision.deepstack_visual_indexes == [5, 11, 17]
    assert cfg.vision.patch_dim == 3 * 2 * 16 * 16 and cfg.vision.rope_theta == 10_000.0
    assert Qwen3VLConfig.from_hf(cfg.to_hf()) == cfg
