"""DeepSeek-V3 routing: the same experts and weights as transformers' router, and 0 router flips between the
engine's cached path and the trainer's packed forward on the aligned op set."""

import random

import pytest
import torch

from rz_agents.model import KVCache, ModelConfig, Transformer
from rz_agents.model.alignment import run_cached
from rz_agents.model.deepseek_moe import DeepseekMoE
from rz_agents.model.kv_cache import pages_for
from rz_agents.model.logprobs import packed_token_logprobs
from rz_kernels.grouped_route import grouped_top_k, sigmoid_route

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared 2-core machine: no oversubscription
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("n_group,topk_group,normalize", [(4, 2, True), (1, 1, True), (8, 3, False)])
def test_sigmoid_route_equals_transformers_router(n_group, topk_group, normalize):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    cfg = transformers.DeepseekV3Config(
        hidden_size=32,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_group=n_group,
        topk_group=topk_group,
        norm_topk_prob=normalize,
        routed_scaling_factor=2.5,
    )
    router = DeepseekV3TopkRouter(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=gen))
        router.e_score_correction_bias.copy_(torch.randn(16, generator=gen) * 0.3)
    x = torch.randn(200, 32, generator=gen)
    logits, hf_weights, hf_experts = router(x)
    weights, experts = sigmoid_route(
        logits, router.e_score_correction_bias, 4, n_group, topk_group, normalize, 2.5
    )
    # HF's top-k is unsorted: compare each token's expert set and the weight of each expert.
    order, hf_order = experts.sort(-1), hf_experts.sort(-1)
    assert torch.equal(order.values, hf_order.values)
    torch.testing.assert_close(
        weights.gather(1, order.indices), hf_weights.gather(1, hf_order.indices), rtol=1e-6, atol=1e-7
    )


def test_group_and_expert_ties_go_to_the_lowest_index():
    # 4 experts in 2 groups, all scores equal: group 0 wins the tie, then experts 0 and 1 in that order.
    scores = torch.full((3, 4), 0.5)
    weights, experts = grouped_top_k(scores, torch.zeros(4), 2, 2, 1, True, 1.0)
    assert experts.tolist() == [[0, 1]] * 3
    assert torch.equal(weights, torch.full((3, 2), 0.5))
    # The correction bias steers the choice but never the weights.
    weights, experts = grouped_top_k(scores, torch.tensor([0.0, 0.0, 0.0, 1.0]), 2, 2, 1, False, 2.0)
    assert experts.tolist() == [[3, 2]] * 3 and torch.equal(weights, torch.full((3, 2), 1.0))


class _Recorder:
    """(layer, sequence, position) -> experts of every DeepseekMoE routing decision while enabled."""

    def __init__(self, model: Transformer) -> None:
        self.records: dict[tuple[int, int, int], tuple[int, ...]] = {}
        for index, layer in enumerate(m for m in model.modules() if isinstance(m, DeepseekMoE)):
            layer.forward = self._wrap(layer, index)

    def _wrap(self, layer: DeepseekMoE, index: int):
        original_route, original_forward = layer.route, layer.forward

        def forward(x, ctx):
            def route(h, ops):
                weights, experts = original_route(h, ops)
                seqs, positions = ctx.record_seq.tolist(), ctx.positions.tolist()
                for s, p, e in zip(seqs, positions, experts.tolist(), strict=True):
                    self.records[(index, s, p)] = tuple(e)
                return weights, experts

            layer.route = route
            try:
                return original_forward(x, ctx)
            finally:
                layer.route = original_route

        return forward


def _routing(model: Transformer, seqs, seed: int):
    """Routing decisions and log-probs of the cached path (chunked prefill + decode) and of the packed
    forward."""
    from rz_agents.model import transformer

    original = transformer._Context.__init__

    def init(self, m, positions, seq_ids, kv, *rest):
        original(self, m, positions, seq_ids, kv, *rest)
        self.record_seq = seq_ids  # cached path: row of the page table; packed: sequence index (same order)

    rec = _Recorder(model)
    transformer._Context.__init__ = init
    try:
        cache = KVCache(model.config, num_pages=len(seqs) * pages_for(max(map(len, seqs))) + 4)
        cached = run_cached(model, seqs, cache, random.Random(seed), chunked=True)
        infer, rec.records = rec.records, {}
        with torch.no_grad():
            packed = packed_token_logprobs(model, seqs)
        train = rec.records
    finally:
        transformer._Context.__init__ = original
    return infer, train, cached, packed


def _tiny_moe(dtype: str, kernels: str) -> tuple[Transformer, list[torch.Tensor]]:
    cfg = ModelConfig.tiny(
        "deepseek_v3", dtype=dtype, n_group=4, topk_group=2, num_experts=16, num_experts_per_tok=3
    )
    model = Transformer(cfg, kernels=kernels)
    model.reset_parameters(std=0.1, seed=5)
    model.fuse_projections()  # the engine's cached path runs the stacked GEMMs
    gen = torch.Generator().manual_seed(3)
    return model, [torch.randint(0, cfg.vocab_size, (n,), generator=gen) for n in (70, 5, 33, 120, 12)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_and_trainer_route_every_token_identically(dtype):
    model, seqs = _tiny_moe(dtype, "aligned")
    infer, train, cached, packed = _routing(model, seqs, seed=1)
    assert infer.keys() == train.keys() and len(infer) == 2 * sum(map(len, seqs))  # 2 MoE layers
    flips = sum(infer[k] != train[k] for k in infer)
    assert flips == 0
    for a, b in zip(cached, packed, strict=True):
        assert torch.equal(a, b)


def test_standard_kernels_negative_control_differs():
    model, seqs = _tiny_moe("bfloat16", "standard")
    _, _, cached, packed = _routing(model, seqs, seed=1)
    assert not all(torch.equal(a, b) for a, b in zip(cached, packed, strict=True))
