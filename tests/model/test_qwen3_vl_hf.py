"""Qwen3-VL: our model equals transformers' own (fp32) on tiny random checkpoints that transformers wrote, fed
real images (PIL drawings of different sizes) through transformers' Qwen2-VL image processor and prompts made
with the Qwen tokenizer and the chat template's image placeholders; checkpoints round-trip exactly.

Biases and norm weights are randomized (transformers initializes them to 0 / 1, which would hide a path that
drops one). Negative controls: dropping the images, or rotating image tokens by their token index instead of
their 3D positions, moves the log-probs far beyond the tolerance.
"""

import dataclasses
import json

import pytest
import torch

from rz_agents.model.checkpoint import load_hf_checkpoint, read_model_config, save_hf_checkpoint
from rz_agents.model.qwen3_vl import Qwen3VLModel, VLSequence, packed_logprobs, sequence_logprobs
from rz_agents.model.qwen3_vl_config import ImageProcessing, Qwen3VLConfig
from rz_agents.model.vl_processor import expand_image_pads, preprocess_images

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")
ImageDraw = pytest.importorskip("PIL.ImageDraw")

IMAGE_PAD = 151655
TOL = 1e-4

CASES = {
    # 3 text layers, deepstack into the first 2, tanh GELU, untied head, GQA
    "untied-deepstack2": dict(
        text=dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, mrope=[2, 3, 3]),
        vision=dict(depth=3, num_heads=2, deepstack_visual_indexes=[0, 2], hidden_act="gelu_pytorch_tanh"),
        tie=False,
    ),
    # tied embeddings, erf GELU, one deepstack layer, a 6x6 learned position grid, Qwen's 24:20:20 split
    "tied-gelu": dict(
        text=dict(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, mrope=[4, 2, 2]),
        vision=dict(
            depth=2, num_heads=4, deepstack_visual_indexes=[1], hidden_act="gelu", num_position_embeddings=36
        ),
        tie=True,
    ),
}


def _hf_config(case: dict):
    text = dict(case["text"])
    section = text.pop("mrope")
    vision = dict(
        hidden_size=32, intermediate_size=48, patch_size=8, spatial_merge_size=2, temporal_patch_size=2,
        out_hidden_size=32, num_position_embeddings=16,
    )  # fmt: skip
    vision.update(case["vision"])
    return transformers.Qwen3VLConfig(
        text_config=dict(
            vocab_size=151936, hidden_size=32, intermediate_size=64, head_dim=16, max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section,
                             "mrope_interleaved": True},
            **text,
        ),
        vision_config=vision,
        tie_word_embeddings=case["tie"],
    )  # fmt: skip


def _images():
    """Drawings of different sizes and aspect ratios (the processor resizes each to its own grid)."""
    out = []
    for i, ((w, h), fill) in enumerate([((70, 45), "red"), ((40, 64), "blue"), ((96, 33), "green")]):
        im = Image.new("RGB", (w, h), (250, 250, 240))
        d = ImageDraw.Draw(im)
        d.rectangle([3 + i, 4, w // 2, h // 2], fill=fill)
        d.ellipse([w // 3, h // 3, w - 2, h - 2], outline="black", width=2)
        d.text((2, h - 12), f"{i}7", fill="black")
        out.append(im)
    return out


@pytest.fixture(scope="module")
def tokenizer():
    from rz_agents.model.tokenizer import qwen3_tokenizer

    return qwen3_tokenizer()


def _prompt(tokenizer, n_images: int, text: str) -> list[int]:
    image = "<|vision_start|><|image_pad|><|vision_end|>"
    chat = (
        f"<|im_start|>user\n{image * n_images}{text}<|im_end|>\n<|im_start|>assistant\nIt shows 7.<|im_end|>"
    )
    return tokenizer.encode(chat)


@pytest.fixture(scope="module", params=sorted(CASES))
def hf_checkpoint(request, tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.Qwen3VLForConditionalGeneration(_hf_config(CASES[request.param])).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module")
def batch(hf_checkpoint, tokenizer):
    """Three sequences: two images, one image, text only; with the processor's pixels and grids."""
    _, path = hf_checkpoint
    vision = read_model_config(path).vision
    small = ImageProcessing(min_pixels=16 * 16, max_pixels=64 * 64)
    vision = dataclasses.replace(vision, image_processing=small)
    images = _images()
    pixels, grids = preprocess_images(images, vision)
    counts = grids.prod(-1).tolist()
    starts = [0, counts[0], counts[0] + counts[1]]
    seqs = []
    for imgs, text in (([0, 1], "Which number is drawn?"), ([2], "Describe it."), ([], "No image here.")):
        g = grids[imgs]
        tokens = expand_image_pads(_prompt(tokenizer, len(imgs), text), g, IMAGE_PAD, 2)
        pv = torch.cat([pixels[starts[i] : starts[i] + counts[i]] for i in imgs]) if imgs else None
        seqs.append(VLSequence(tokens, g if imgs else None, pv))
    return seqs


def _hf_logprobs(model, seq: VLSequence) -> torch.Tensor:
    ids = torch.tensor([seq.tokens])
    kwargs = {}
    if seq.pixel_values is not None:
        kwargs = dict(
            pixel_values=seq.pixel_values,
            image_grid_thw=torch.as_tensor(seq.image_grid_thw),
            mm_token_type_ids=(ids == IMAGE_PAD).int(),
        )
    with torch.no_grad():
        logits = model(input_ids=ids, **kwargs).logits[0].float()
    return torch.log_softmax(logits, -1)[:-1].gather(1, ids[0, 1:, None])[:, 0]


def test_processor_and_placeholders_give_one_token_per_merged_patch(batch):
    for seq in batch[:2]:
        grids = torch.as_tensor(seq.image_grid_thw)
        assert sum(t == IMAGE_PAD for t in seq.tokens) == int(grids.prod(-1).sum()) // 4
        assert seq.pixel_values.shape == (int(grids.prod(-1).sum()), 3 * 2 * 8 * 8)
    all_grids = torch.cat([torch.as_tensor(s.image_grid_thw) for s in batch[:2]])
    assert len({tuple(g) for g in all_grids.tolist()}) == 3  # three different grids


def test_logprobs_match_transformers(hf_checkpoint, batch):
    hf, path = hf_checkpoint
    model = load_hf_checkpoint(path)
    assert isinstance(model, Qwen3VLModel)
    worst = 0.0
    with torch.no_grad():
        packed = packed_logprobs(model, batch)
        for seq, got in zip(batch, packed, strict=True):
            ref = _hf_logprobs(hf, seq)
            _, alone = sequence_logprobs(model, seq.tokens, seq.pixel_values, seq.image_grid_thw)
            worst = max(worst, (got - ref).abs().max().item(), (alone - ref).abs().max().item())
    print(f"max |dlogp| rz vs transformers ({path.name}): {worst:.3g}")
    assert worst <= TOL


def test_3d_positions_match_transformers(hf_checkpoint, batch):
    hf, path = hf_checkpoint
    model = load_hf_checkpoint(path)
    for seq in batch[:2]:
        ids = torch.tensor([seq.tokens])
        ref, delta = hf.model.get_rope_index(
            ids, (ids == IMAGE_PAD).int(), image_grid_thw=torch.as_tensor(seq.image_grid_thw)
        )
        got, got_delta = model.rope_positions(seq.tokens, seq.image_grid_thw)
        assert torch.equal(got, ref[:, 0]) and got_delta == int(delta)


def test_negative_controls_images_and_3d_positions_matter(hf_checkpoint, batch):
    hf, path = hf_checkpoint
    model = load_hf_checkpoint(path)
    seq = batch[0]
    ref = _hf_logprobs(hf, seq)
    ids = torch.tensor(seq.tokens)
    with torch.no_grad():
        _, no_images = sequence_logprobs(model, seq.tokens)  # placeholders embedded as plain tokens
        images = model.encode_images(seq.pixel_values, seq.image_grid_thw)
        hidden = model(ids, torch.arange(ids.numel()), images=images)  # 1D positions for image tokens
        flat = torch.log_softmax(model.logits(hidden), -1)[:-1].gather(1, ids[1:, None])[:, 0]
    assert (no_images - ref).abs().max().item() > 100 * TOL
    assert (flat - ref).abs().max().item() > 10 * TOL


def test_save_round_trip_is_exact_and_transformers_loads_it(hf_checkpoint, batch, tmp_path):
    hf, path = hf_checkpoint
    model = load_hf_checkpoint(path)
    save_hf_checkpoint(model, tmp_path / "saved")
    again = load_hf_checkpoint(tmp_path / "saved")
    a, b = model.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert again.vl_config == model.vl_config
    assert (
        Qwen3VLConfig.from_hf(json.loads((tmp_path / "saved" / "config.json").read_text())) == model.vl_config
    )
    reloaded = transformers.Qwen3VLForConditionalGeneration.from_pretrained(tmp_path / "saved").eval()
    ref = dict(hf.state_dict())
    assert all(torch.equal(v, ref[k]) for k, v in reloaded.state_dict().items())
    assert torch.equal(_hf_logprobs(reloaded, batch[0]), _hf_logprobs(hf, batch[0]))
