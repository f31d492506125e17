"""Qwen3-VL on the Triton op set (through the interpreter here): the vision tower's encoding of an image does
not depend on the other images of the call (its attention is one SDPA call per image there: the causal Triton
kernel places queries by position), and the cached-inference path (chunked prefill cutting through an image,
then decode) equals the packed training forward bit for bit, bf16. The Triton model also agrees with the CPU
aligned op set's to rounding (fp32)."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from rz_agents.model.kv_cache import KVCache  # noqa: E402
from rz_agents.model.qwen3_vl import Qwen3VLModel, VLSequence, packed_logprobs  # noqa: E402
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig  # noqa: E402
from rz_kernels import gather_logprobs, sampling_logprobs  # noqa: E402

IMG, START, END = 300, 302, 303
GRIDS = [(1, 2, 2), (1, 4, 6), (1, 2, 4)]


def _model(dtype: str, kernels: str = "triton") -> Qwen3VLModel:
    cfg = Qwen3VLConfig.tiny(
        dtype=dtype, hidden_size=32, num_attention_heads=2, num_key_value_heads=1, vocab_size=320
    )
    model = Qwen3VLModel(cfg, kernels=kernels)
    model.reset_parameters(std=0.1, seed=1)
    return model


def _pixels(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(t * h * w, 384, generator=gen) for t, h, w in GRIDS]


def test_triton_vision_tower_is_batch_invariant_and_agrees_with_the_cpu_kernels():
    model = _model("bfloat16")
    pixels = _pixels()
    with torch.no_grad():
        alone = [model.encode_images(p, [g]) for p, g in zip(pixels, GRIDS, strict=True)]
        packed = model.encode_images(torch.cat(pixels[::-1]), GRIDS[::-1]).split()[::-1]
    for a, b in zip(alone, packed, strict=True):
        assert torch.equal(a.embeds, b.embeds)
        assert all(torch.equal(x, y) for x, y in zip(a.deepstack, b.deepstack, strict=True))
    fp32 = _model("float32")
    with torch.no_grad():
        tri = fp32.encode_images(torch.cat(pixels), GRIDS)
        fp32.set_kernels("aligned")
        cpu = fp32.encode_images(torch.cat(pixels), GRIDS)
    assert (tri.embeds - cpu.embeds).abs().max() < 1e-4


def test_triton_cached_prefill_and_decode_equal_the_training_forward_bf16():
    model = _model("bfloat16")
    gen = torch.Generator().manual_seed(3)
    grids = GRIDS[1:]
    tokens = [5, 6]
    for t, h, w in grids:
        tokens += [START] + [IMG] * (t * h * w // 4) + [END, 9]
    tokens += [20, 21]
    pixels = torch.randn(sum(t * h * w for t, h, w in grids), 384, generator=gen)
    rope, _ = model.rope_positions(tokens, grids)
    ids = torch.tensor(tokens)
    with torch.no_grad():
        images = model.encode_images(pixels, grids)
        (train,) = packed_logprobs(model, [VLSequence(tokens, grids, pixels)])
        cache = KVCache(model.config, num_pages=4)
        table = torch.tensor([[3, 1]])
        slots = [i for i, t in enumerate(tokens) if t == IMG]
        cut = len(tokens) - 2
        bounds = [(0, 5), (5, cut)] + [(p, p + 1) for p in range(cut, len(tokens))]  # 5: inside image 1
        got = []
        for a, b in bounds:
            rows = torch.tensor([k for k, s in enumerate(slots) if a <= s < b], dtype=torch.long)
            view = cache.view(table, max_position=b - 1, decode_positions=(a,) if b - a == 1 else None)
            part = images.rows(rows) if rows.numel() else None
            hidden = model(ids[a:b], torch.arange(a, b), torch.zeros(b - a, dtype=torch.long), kv_cache=view,
                           rope_positions=rope[:, a:b], images=part)  # fmt: skip
            lp = gather_logprobs(sampling_logprobs(model.logits(hidden), 1.0, 0, 1.0), ids[a + 1 : b + 1])
            got.append(lp[: len(ids[a + 1 : b + 1])])
    assert torch.equal(torch.cat(got), train)
