"""DeepSeek-V4 on rz's op set equals transformers' DeepseekV4ForCausalLM (fp32, eager) on tiny random
checkpoints written by transformers: every layer type (sliding, CSA, HCA), both MoE kinds (hash_moe, moe),
each router scoring function, YaRN on the compressed branches; weights scaled so logits are sharp. Controls
(a compression rate, the indexer's top-k, the hyper-connection mixing, each changed slightly) move the figure
past the tolerance. Checkpoints load and save exactly; FP8 weights are refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from rz_agents.model.checkpoint import save_hf_checkpoint
from rz_agents.model.deepseek_v4 import load_deepseek_v4

hf_models = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOL = 1e-4
VOCAB, EXPERTS, TOP_K = 96, 6, 2
LENS = [40, 27]  # several windows of each rate, the sliding window (8) passed, more CSA entries than top-k
LAYERS = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
          "compressed_sparse_attention"]  # fmt: skip
MLP_LAYERS = ["hash_moe", "moe", "moe", "hash_moe"]
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32,
        "beta_slow": 1}  # fmt: skip


def _hf_config(scoring: str, yarn: bool):
    cfg = hf_models.DeepseekV4Config(
        vocab_size=VOCAB, hidden_size=48, moe_intermediate_size=24, num_hidden_layers=len(LAYERS),
        num_attention_heads=4, head_dim=16, q_lora_rank=20, num_experts_per_tok=TOP_K,
        n_routed_experts=EXPERTS,
        layer_types=LAYERS, mlp_layer_types=MLP_LAYERS,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        hc_mult=3, hc_sinkhorn_iters=5, sliding_window=8, o_groups=2, o_lora_rank=12,
        # 8 indexer heads: a score is 0 (a tie) only when all 8 heads' relus are, which the test checks never
        # happens at a selection boundary (the order of exact ties is torch.topk's own, unspecified)
        index_n_heads=8, index_head_dim=24, index_topk=3, partial_rotary_factor=0.5,
        max_position_embeddings=256, scoring_func=scoring,
        rope_parameters=YARN if yarn else None,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    return cfg


def _write(path, scoring: str, yarn: bool, seed: int):
    """A tiny DeepseekV4ForCausalLM saved by transformers: matrices x3 (LM head x48) so logits are sharp,
    the biases, sinks and hc bases random (their init is zero: a path that drops one would pass unseen), the
    hash tables distinct random experts per token."""
    torch.manual_seed(seed)
    hf_scoring = "sigmoid" if scoring == "softmax" else scoring
    model = hf_models.DeepseekV4ForCausalLM(_hf_config(hf_scoring, yarn)).eval()
    if scoring == "softmax":
        # transformers 5.19 builds no "softmax" router (ACT2FN has none): its routers take torch's softmax
        # over the experts, the rest of its code unchanged, and the config says softmax
        for mod in model.modules():
            if hasattr(mod, "score_fn"):
                mod.score_fn = nn.Softmax(dim=-1)
        model.config.scoring_func = "softmax"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.mul_(3 * (16 if name == "lm_head.weight" else 1))
            elif name.endswith(("position_bias", "sinks", "base")):
                p.normal_()
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                b.copy_(torch.stack([torch.randperm(EXPERTS)[:TOP_K] for _ in range(VOCAB)]))
            elif name.endswith("e_score_correction_bias"):
                b.normal_(0, 0.1)
    model.save_pretrained(path)
    tokens = torch.randint(0, VOCAB, (sum(LENS),), generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        ref = torch.cat([model(s.unsqueeze(0)).logits[0] for s in torch.split(tokens, LENS)])
    return path, tokens, ref.float().log_softmax(-1), model


CASES = {
    "sqrtsoftplus": ("sqrtsoftplus", False),
    "sigmoid_yarn": ("sigmoid", True),
    "softmax": ("softmax", False),
}


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(request, tmp_path_factory):
    scoring, yarn = CASES[request.param]
    return _write(tmp_path_factory.mktemp(request.param), scoring, yarn, seed=len(request.param))


def _packed():
    positions = torch.cat([torch.arange(n) for n in LENS])
    seq_ids = torch.cat([torch.full((n,), i) for i, n in enumerate(LENS)])
    return positions, seq_ids


def _figure(model, tokens, ref_logp) -> float:
    positions, seq_ids = _packed()
    with torch.no_grad():
        logp = model.logits(model(tokens, positions, seq_ids)).log_softmax(-1)
    return (logp - ref_logp).abs().max().item()


def _no_boundary_ties(model, tokens) -> bool:
    """True when no query's k-th and (k+1)-th best indexer scores are equal (the selection is then defined
    without a tie order)."""
    from rz_kernels import sparse_select

    seen = []
    real = sparse_select.aligned_top_k

    def spy(scores, k):
        seen.append(scores)
        return real(scores, k)

    import rz_agents.model.deepseek_v4_attention as attention

    forms = attention.ALIGNED_FORMS
    attention.ALIGNED_FORMS = attention.SparseForms(forms.pool, forms.scores, spy, forms.attention)
    try:
        _figure(model, tokens, torch.zeros(1))
    finally:
        attention.ALIGNED_FORMS = forms
    for scores in seen:
        top = torch.sort(scores, dim=-1, descending=True).values
        k = model.config.index_topk
        if top.shape[1] > k:
            edge = top[:, k - 1]
            if bool(((edge == top[:, k]) & torch.isfinite(edge)).any()):
                return False
    return True


@pytest.mark.parametrize("kernels", ["aligned", "standard"])
def test_deepseek_v4_matches_transformers(checkpoint, kernels):
    path, tokens, ref_logp, _ = checkpoint
    model = load_deepseek_v4(path, kernels=kernels)
    assert _no_boundary_ties(model, tokens)
    figure = _figure(model, tokens, ref_logp)
    print(f"\n{model.config.scoring_func} {kernels}: max |dlogp| {figure:.3g}")
    assert figure <= TOL


def test_controls_move_the_figure(checkpoint):
    """A compression rate halved, the indexer keeping one block more, one layer's stream mixing changed by
    0.1%: each puts the figure past the tolerance (the comparison sees each part)."""
    path, tokens, ref_logp, _ = checkpoint
    model = load_deepseek_v4(path)
    assert _figure(model, tokens, ref_logp) <= TOL
    hca = model.model.layers[2].attn.compressor
    hca.rate = 4
    model.config.hca_rate = 4
    with torch.no_grad():
        hca.ape = nn.Parameter(hca.ape[:4].clone())
    model.model.layers[2].attn.rate = 4
    figures = [_figure(model, tokens, ref_logp)]
    model = load_deepseek_v4(path)
    model.model.layers[1].attn.indexer.top_k += 1
    figures.append(_figure(model, tokens, ref_logp))
    model = load_deepseek_v4(path)
    with torch.no_grad():
        model.model.layers[1].hc_ffn_fn.mul_(1.001)
    figures.append(_figure(model, tokens, ref_logp))
    print(f"\ncontrols (HCA rate 8->4, top-k 3->4, hc x1.001): {', '.join(f'{f:.3g}' for f in figures)}")
    assert min(figures) > TOL


def test_save_round_trip_is_exact(checkpoint, tmp_path):
    """rz's save of a loaded checkpoint holds the same tensors and config; transformers loads it to the
    same logits bit for bit."""
    from safetensors.torch import load_file

    path, tokens, _, hf_model = checkpoint
    model = load_deepseek_v4(path)
    out = save_hf_checkpoint(model, tmp_path / "saved")
    original, saved = load_file(str(path / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert set(original) == set(saved)
    assert all(torch.equal(original[k], saved[k]) for k in original)
    assert json.loads((out / "config.json").read_text()) == json.loads((path / "config.json").read_text())
    if model.config.scoring_func == "softmax":
        return  # transformers 5.19 cannot build a softmax router (the reference above patches its routers)
    again = hf_models.DeepseekV4ForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    with torch.no_grad():
        seq = tokens[: LENS[0]].unsqueeze(0)
        assert torch.equal(again(seq).logits, hf_model(seq).logits)


RELEASED = {"embed_tokens.weight": "embed.weight", "hc_head.hc_fn": "hc_head_fn",
            "hc_head.hc_base": "hc_head_base", "hc_head.hc_scale": "hc_head_scale"}  # fmt: skip


def test_released_names_load_the_same(checkpoint, tmp_path):
    """DeepSeek's release names (no `model.` prefix, `embed.weight`, `hc_head_fn`, ...) load to the same
    model; an FP8 tensor is refused in one line naming it."""
    from safetensors.torch import load_file, save_file

    path, tokens, ref_logp, _ = checkpoint
    state = load_file(str(path / "model.safetensors"))
    renamed = {}
    for name, t in state.items():
        name = name.removeprefix("model.")
        renamed[RELEASED.get(name, name)] = t
    released = tmp_path / "released"
    released.mkdir()
    (released / "config.json").write_text((path / "config.json").read_text())
    save_file(renamed, str(released / "model.safetensors"))
    assert _figure(load_deepseek_v4(released), tokens, ref_logp) <= TOL
    renamed["layers.0.attn.wq_a.weight"] = renamed["layers.0.attn.wq_a.weight"].to(torch.float8_e4m3fn)
    save_file(renamed, str(released / "model.safetensors"))
    with pytest.raises(ValueError, match="FP8/FP4-quantized.*dequantize"):
        load_deepseek_v4(released)
