"""Qwen3.5 with its vision tower: equal to transformers' Qwen3_5ForConditionalGeneration (fp32, eager) on a
tiny random checkpoint transformers wrote, with sharp logits, for a prompt with one image and one with two;
0.1% errors in the vision tower's 2D RoPE, in the merger or in the M-RoPE split move the figure past the
tolerance (controls); the checkpoint loads through the policy builder and saves back exactly.

The checkpoint's text matrices are scaled (x3, LM head x48: logits std ~7.7), the tower's x3 (its qkv x5, so
its attention is sharp enough for a 0.1% rotary error to show), its biases and norm weights randomized
(transformers starts them at 0 / 1, which would hide a path that drops one)."""

import pytest
import torch

from rz_agents.model.logprobs import packed_token_logprobs
from rz_agents.model.qwen3_5_vl import Qwen35VLForConditionalGeneration, load_qwen3_5_vl
from rz_agents.model.vision import VLSequence
from rz_kernels import RopeTable

hf_models = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOL = 1e-4
VOCAB, IMAGE, START, END = 320, 300, 302, 303
GRIDS = torch.tensor([[1, 4, 6], [1, 6, 4]])  # (t, h, w) patches: 6 merged tokens each
VISION_HEAD = 16


def _hf_config():
    text = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    )  # fmt: skip
    vision = dict(
        depth=2, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=8, spatial_merge_size=2,
        temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16,
    )  # fmt: skip
    cfg = hf_models.Qwen3_5Config(
        text_config=text, vision_config=vision, image_token_id=IMAGE, video_token_id=301,
        vision_start_token_id=START, vision_end_token_id=END,
    )  # fmt: skip
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
    return cfg


def _prompt(images: list[int], gen: torch.Generator) -> list[int]:
    tokens = torch.randint(0, IMAGE, (20,), generator=gen).tolist()
    for i in images:
        tokens += [START] + [IMAGE] * (int(GRIDS[i].prod()) // 4) + [END]
        tokens += torch.randint(0, IMAGE, (15,), generator=gen).tolist()
    return tokens


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(directory, [one image, two images] VLSequences, transformers' log-probs of each)."""
    torch.manual_seed(0)
    model = hf_models.Qwen3_5ForConditionalGeneration(_hf_config()).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("model.visual."):
                if name.endswith("bias") or "norm" in name:
                    p.add_(torch.randn_like(p) * 0.2)
                elif p.dim() >= 2:
                    p.mul_(5 if ".qkv." in name else 3)
            elif p.dim() == 2:
                p.mul_(3 * (16 if name == "lm_head.weight" else 1))
    path = tmp_path_factory.mktemp("qwen3_5_vl")
    model.save_pretrained(path)
    gen = torch.Generator().manual_seed(1)
    pixels = torch.randn(int(GRIDS.prod(-1).sum()), 3 * 2 * 8 * 8, generator=gen)
    seqs = [
        VLSequence(_prompt([0], gen), GRIDS[:1], pixels[:24]),
        VLSequence(_prompt([0, 1], gen), GRIDS, pixels),
    ]
    refs = []
    for s in seqs:
        ids = torch.tensor([s.tokens])
        with torch.no_grad():
            logits = model(
                input_ids=ids, pixel_values=s.pixel_values, image_grid_thw=s.image_grid_thw,
                mm_token_type_ids=(ids == IMAGE).int(),
            ).logits[0].float()  # fmt: skip
        refs.append(logits.log_softmax(-1)[:-1].gather(1, ids[0, 1:, None])[:, 0])
    sharp = logits.softmax(-1).max(-1).values.mean().item()
    return path, seqs, refs, sharp


def _figure(model, seqs, refs) -> float:
    with torch.no_grad():
        got = packed_token_logprobs(model, seqs)
    return max((g - r).abs().max().item() for g, r in zip(got, refs, strict=True))


def test_equal_to_transformers_with_images_and_controls_for_vision_rope_merger_and_mrope(checkpoint):
    path, seqs, refs, sharp = checkpoint
    assert sharp > 0.5  # sharp: the top token carries most of the mass
    model = load_qwen3_5_vl(path)
    assert isinstance(model, Qwen35VLForConditionalGeneration) and model.vl_config.mrope_section == [2, 1, 1]
    assert _figure(model, seqs, refs) <= TOL
    # controls: each 0.1% error must move the figure past the tolerance
    good = model.visual.rope_base
    inv = 1.0 / (10000.0 ** (torch.arange(0, VISION_HEAD // 2, 2).float() / (VISION_HEAD // 2)))
    model.visual.rope_base = RopeTable(VISION_HEAD // 2, 0.0, 4096, inv_freq=inv * 1.001)
    assert _figure(model, seqs, refs) > TOL
    model.visual.rope_base = good
    weight = model.visual.merger.linear_fc2.weight
    with torch.no_grad():
        weight.mul_(1.001)
        assert _figure(model, seqs, refs) > TOL
        weight.div_(1.001)
    model.vl_config.mrope_section = [4, 0, 0]  # every frequency on the temporal axis: plain 1D positions
    assert _figure(model, seqs, refs) > TOL


def test_policy_builder_loads_it_and_a_save_round_trip_is_exact(checkpoint, tmp_path):
    from rz_agents.model.checkpoint import load_hf_checkpoint, read_config, save_hf_checkpoint
    from rz_agents.model.freeze import freeze_vision_tower

    path, seqs, refs, _ = checkpoint
    model = load_hf_checkpoint(path)
    assert isinstance(model, Qwen35VLForConditionalGeneration)
    assert read_config(path).model_type == "qwen3_5_text"  # (the memory estimate's: the text decoder)
    save_hf_checkpoint(model, tmp_path / "saved")
    again = load_hf_checkpoint(tmp_path / "saved")
    assert again.vl_config == model.vl_config
    a, b = model.state_dict(), again.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    hf = hf_models.Qwen3_5ForConditionalGeneration.from_pretrained(tmp_path / "saved").eval()
    assert list(hf.state_dict()) == list(a)  # every tensor transformers has, by name, in its order
    assert all(torch.equal(hf.state_dict()[k], a[k]) for k in a)
    assert freeze_vision_tower(model) == sum(p.numel() for p in model.visual.parameters())


def test_a_text_model_refuses_images_and_the_vl_model_counts_placeholders(checkpoint):
    from rz_agents.model.qwen3_5 import load_qwen3_5

    path, seqs, _, _ = checkpoint
    text = load_qwen3_5(path)  # the text decoder alone (the tower skipped, as transformers' CausalLM does)
    with pytest.raises(ValueError, match="takes no images"):
        packed_token_logprobs(text, seqs[:1])
    model = load_qwen3_5_vl(path)
    bad = VLSequence(seqs[0].tokens[:10] + [IMAGE] * 5, GRIDS[:1], seqs[0].pixel_values)  # 5 for 6 rows
    with pytest.raises(ValueError, match="image 0 .* needs 6 consecutive image tokens"):
        packed_token_logprobs(model, [bad])


def test_the_screenshot_config_builds_a_vision_language_policy_and_its_template():
    """configs/qwen3_5-visual-click-demo.yaml (a tiny Qwen3.5 with a tower, `tiny_overrides.vision`): the
    spec's config, which the Ray driver's template reads without building the model, equals the built
    model's, so the template's placeholder runs match the engines' and learners' models."""
    from rz_agents.cli.train import load_run_config
    from rz_agents.rollout.byte_chat import ByteChatTemplate
    from rz_agents.rollout.byte_vl_chat import ByteVLChatTemplate
    from rz_agents.runtime.factories import build_model, policy_template, spec_vl_config

    spec = load_run_config("qwen3_5-visual-click-demo").model
    vl = spec_vl_config(spec, 320)
    model = build_model(spec, 320)
    assert isinstance(model, Qwen35VLForConditionalGeneration) and vl == model.vl_config
    assert vl.image_token_id == 300 and vl.mrope_section == [2, 1, 1] and vl.vision.patch_size == 16
    assert isinstance(policy_template(ByteChatTemplate(), vl), ByteVLChatTemplate)


def test_a_moe_vision_language_checkpoint_loads_equal_to_transformers_and_saves_back_exactly(tmp_path):
    """qwen3_5_moe with its tower (transformers' Qwen3_5MoeForConditionalGeneration): the same model class,
    every MLP routed experts (model/qwen3_5_moe.py); one image, sharp logits (std ~7.6)."""
    from rz_agents.model.checkpoint import load_hf_checkpoint, save_hf_checkpoint

    cfg = _hf_config().to_dict()
    text = {k: v for k, v in cfg["text_config"].items() if k != "intermediate_size"}
    text.update(model_type="qwen3_5_moe_text", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                shared_expert_intermediate_size=64)  # fmt: skip
    vision = {**cfg["vision_config"], "model_type": "qwen3_5_moe_vision"}
    ids = {
        k: cfg[k]
        for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    }
    moe_cfg = hf_models.Qwen3_5MoeConfig(text_config=text, vision_config=vision, **ids)
    for c in (moe_cfg, moe_cfg.text_config, moe_cfg.vision_config):
        c._attn_implementation = "eager"
    torch.manual_seed(1)
    hf = hf_models.Qwen3_5MoeForConditionalGeneration(moe_cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.startswith("model.visual.") and (name.endswith("bias") or "norm" in name):
                p.add_(torch.randn_like(p) * 0.2)
            elif p.dim() >= 2:
                p.mul_(3 * (16 if name == "lm_head.weight" else 1))
    hf.save_pretrained(tmp_path / "hf")
    gen = torch.Generator().manual_seed(1)
    pixels = torch.randn(24, 3 * 2 * 8 * 8, generator=gen)
    seq = VLSequence(_prompt([0], gen), GRIDS[:1], pixels)
    ids_t = torch.tensor([seq.tokens])
    with torch.no_grad():
        logits = hf(input_ids=ids_t, pixel_values=pixels, image_grid_thw=GRIDS[:1],
                    mm_token_type_ids=(ids_t == IMAGE).int()).logits[0].float()  # fmt: skip
    ref = logits.log_softmax(-1)[:-1].gather(1, ids_t[0, 1:, None])[:, 0]
    model = load_hf_checkpoint(tmp_path / "hf")
    assert model.vl_config.model_type == "qwen3_5_moe" and model.config.num_experts == 8
    assert logits.std() > 3 and _figure(model, [seq], [ref]) <= TOL
    save_hf_checkpoint(model, tmp_path / "saved")
    a, b = model.state_dict(), load_hf_checkpoint(tmp_path / "saved").state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
