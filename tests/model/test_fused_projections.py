"""Fused q/k/v and gate/up projections: one GEMM over stacked weights gives each part's bits, names
unchanged."""

import copy
import dataclasses

import pytest
import torch
from torch import nn

from rz_agents.model import KVCache, ModelConfig, Transformer
from rz_agents.model.fused import FusedLinears
from rz_agents.model.kv_cache import pages_for
from rz_kernels import ALIGNED, STANDARD, gemm

ROWS = (1, 7, 16, 24, 64, 130)


@pytest.fixture(autouse=True)
def _threads(one_torch_thread):
    yield


def _linears(sizes, k, dtype, bias=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        m = nn.Linear(k, n, bias=bias)
        with torch.no_grad():
            m.weight.copy_(torch.randn(n, k, generator=gen))
            if bias:
                m.bias.copy_(torch.randn(n, generator=gen))
        out.append(m.to(dtype).requires_grad_(False))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "sizes,k,bias", [((64, 16, 16), 64, False), ((256, 64, 64), 96, True), ((96, 96), 64, False)]
)
def test_stacked_gemm_gives_each_parts_columns_bit_for_bit_at_every_row_count(dtype, sizes, k, bias):
    linears = _linears(sizes, k, dtype, bias)
    fused = FusedLinears(linears)
    assert fused.usable(ALIGNED)
    gen = torch.Generator().manual_seed(1)
    for m in ROWS:
        x = torch.randn(m, k, generator=gen).to(dtype)
        got = fused(x, ALIGNED)
        for out, lin in zip(got, linears, strict=True):
            assert torch.equal(out, gemm.aligned_linear(x, lin.weight, lin.bias)), (m, lin.weight.shape)


@pytest.mark.parametrize("form", ["mm", "tiled"])
def test_other_cpu_forms_keep_a_parts_columns_when_stacked(form):
    gen = torch.Generator().manual_seed(2)
    ws = [torch.randn(n, 64, generator=gen) for n in (128, 32, 32)]
    run = (
        (lambda x, w: gemm.tiled_linear(x, w))
        if form == "tiled"
        else (lambda x, w: gemm.bucketed_linear(x, w, form="mm"))
    )
    for m in (16, 24, 130):
        x = torch.randn(m, 64, generator=gen)
        assert torch.equal(run(x, torch.cat(ws)), torch.cat([run(x, w) for w in ws], 1)), m


def test_a_stack_whose_form_differs_from_its_parts_is_not_fused(monkeypatch):
    gemm.clear_gemm_verdicts()
    real = gemm.gemm_verdict
    monkeypatch.setattr(
        gemm,
        "gemm_verdict",
        lambda n, k, dtype: gemm.GemmVerdict("tiled") if (n, k) == (96, 32) else real(n, k, dtype),
    )
    try:
        assert not gemm.fusion_verified((64, 16, 16), 32, torch.float32)
        assert gemm.fusion_verified((64, 16, 16), 48, torch.float32)  # same parts, no stacked-shape failure
    finally:
        gemm.clear_gemm_verdicts()


def _model(arch="qwen3", dtype="float32", **kw):
    cfg = ModelConfig.tiny(arch, dtype=dtype, **kw)
    model = Transformer(cfg)
    model.reset_parameters(std=0.1, seed=3)
    return model


def _cached_logits(model, tokens):
    cache = KVCache(model.config, num_pages=pages_for(len(tokens)) + 1)
    table = torch.arange(pages_for(len(tokens))).view(1, -1)
    with torch.no_grad():
        hidden = model(
            tokens, torch.arange(len(tokens)), torch.zeros(len(tokens), dtype=torch.long), cache.view(table)
        )
        return model.logits(hidden)


class _Counting:
    """An op set that counts its GEMMs."""

    def __init__(self, ops):
        self.calls = 0
        self.ops = ops

    def opset(self):
        def linear(*a, **k):
            self.calls += 1
            return self.ops.linear(*a, **k)

        return dataclasses.replace(self.ops, linear=linear)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe", "llama"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_model_cached_forward_equals_unfused_bit_for_bit_and_runs_fewer_gemms(arch, dtype, monkeypatch):
    model = _model(arch, dtype)
    tokens = torch.randint(0, model.config.vocab_size, (70,), generator=torch.Generator().manual_seed(4))
    counting = _Counting(ALIGNED)
    monkeypatch.setattr(model, "ops_for", lambda device: counting.opset())
    ref = _cached_logits(model, tokens)
    unfused_calls, counting.calls = counting.calls, 0
    model.fuse_projections()
    got = _cached_logits(model, tokens)
    assert torch.equal(got, ref)
    layers = model.config.num_hidden_layers
    assert counting.calls < unfused_calls - 2 * layers  # at least the q/k/v fusion of every layer (3 -> 1)


def test_fusing_keeps_parameter_names_identities_and_state_dict():
    model = _model(attention_bias=True)
    before_names = list(model.state_dict())
    params = dict(model.named_parameters())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.fuse_projections()
    assert list(model.state_dict()) == before_names
    assert all(p is params[n] for n, p in model.named_parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.weight.data_ptr() == attn.qkv.weight.data_ptr()
    assert attn.qkv.bias is not None


def test_a_fused_model_saves_and_loads_a_checkpoint_with_the_per_matrix_names(tmp_path):
    from rz_agents.model.checkpoint import load_hf_checkpoint, load_state, save_hf_checkpoint

    model = _model()
    model.fuse_projections()
    save_hf_checkpoint(model, tmp_path / "ckpt")
    assert "model.layers.0.self_attn.k_proj.weight" in load_state(tmp_path / "ckpt")
    loaded = load_hf_checkpoint(tmp_path / "ckpt")
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    loaded.fuse_projections()
    with torch.no_grad():
        loaded.load_state_dict(model.state_dict())  # in place, into the stacked storage
    assert loaded.model.layers[1].mlp.gate_up.current()


def test_a_weight_written_through_its_parameter_reaches_the_fused_gemm():
    model = _model()
    model.fuse_projections()
    tokens = torch.randint(0, model.config.vocab_size, (30,), generator=torch.Generator().manual_seed(5))
    before = _cached_logits(model, tokens)  # packs the stacked weights (CPU packed-weight cache)
    gen = torch.Generator().manual_seed(6)
    new = {
        k: v + 0.05 * torch.randn(v.shape, generator=gen)
        for k, v in model.state_dict().items()
        if "proj" in k
    }
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in new:
                p.copy_(new[name])  # what the engine's load_weights does
    got = _cached_logits(model, tokens)
    model.fuse_projections(False)
    assert torch.equal(got, _cached_logits(model, tokens))
    assert not torch.equal(got, before)


def test_reallocated_parameters_run_unfused_and_to_fuses_again():
    model = _model()
    model.fuse_projections()
    tokens = torch.randint(0, model.config.vocab_size, (20,), generator=torch.Generator().manual_seed(7))
    ref = _cached_logits(model, tokens)
    attn = model.model.layers[0].self_attn
    attn.k_proj.weight.data = attn.k_proj.weight.data.clone()  # outside the stacked storage now
    assert not attn.qkv.current()
    assert torch.equal(_cached_logits(model, tokens), ref)
    model.to(torch.float32)  # Module._apply: stacked again
    assert model.model.layers[0].self_attn.qkv.current()
    twin = copy.deepcopy(model)
    assert twin.model.layers[0].self_attn.qkv is None  # a copy starts unfused, with the same bits
    assert torch.equal(_cached_logits(twin, tokens), ref)


def test_training_forward_stays_unfused_and_its_gradients_reach_every_projection():
    model = _model()
    model.fuse_projections()
    tokens = torch.randint(0, model.config.vocab_size, (12,), generator=torch.Generator().manual_seed(8))
    model.logits(model(tokens, torch.arange(12))).sum().backward()
    for name, p in model.named_parameters():
        if "proj" in name:
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_standard_op_set_fuses_too_but_promises_nothing():
    assert STANDARD.fusable((8, 8), 8, torch.float32)
