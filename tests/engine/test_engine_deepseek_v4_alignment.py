"""DeepSeek-V4 in the engine: every sampled token's log-prob equals the learner's packed forward bit for bit
(torch.equal), with the sliding window's K=V, the compressors' pending rows, the compressed entries and the
indexer's keys in the engine's pages (model/deepseek_v4_cache.py), under batch sizes 1/2/5, prefill cuts at
every offset inside CSA (m=4) and HCA (m=16) blocks, static decode, preemption, prefix reuse (an HCA rate of
128 too, whose windows span two pages) and a weight update, in fp32 and bf16. Every engine forward's indexer
top-k blocks and router experts equal the learner's at the same positions: 0 flips, counted. The negative
control (the standard op set in engine and learner) differs, and its flip rates are printed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, generate_batch
from rz_agents.model.deepseek_v4 import DeepseekV4ForCausalLM
from rz_agents.model.deepseek_v4_config import DeepseekV4Config
from tests.engine.engine_alignment import (
    assert_equal_to_learner as _assert_equal,
)
from tests.engine.engine_alignment import (
    assert_update_recomputes_exactly,
    learner_logprobs,
    random_prompts,
    seeded_params,
)

VOCAB = 128


def _config(dtype: str, **overrides) -> DeepseekV4Config:
    layers = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
              "compressed_sparse_attention")  # fmt: skip
    fields = dict(
        vocab_size=VOCAB, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, head_dim=32, q_lora_rank=24, num_experts_per_tok=2, n_routed_experts=8,
        layer_types=layers, mlp_layer_types=("hash_moe", "moe", "moe", "moe"), csa_rate=4, hca_rate=16,
        qk_rope_head_dim=16, hc_mult=4, hc_sinkhorn_iters=6, sliding_window=16, o_groups=2, o_lora_rank=16,
        index_n_heads=2, index_head_dim=32, index_topk=4, max_position_embeddings=512, dtype=dtype,
        hf={"model_type": "deepseek_v4"},
    )  # fmt: skip
    return DeepseekV4Config(**{**fields, **overrides})


def _model(dtype: str = "float32", seed: int = 0, kernels: str = "aligned", **overrides):
    """A tiny random DeepSeek-V4 (sliding, CSA, HCA, CSA; hash + learned MoE) with sharp logits (weights std
    0.15, the LM head's x3) and random sinks, position biases and router biases (zero at init)."""
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(_config(dtype, **overrides), kernels)
    model.reset_parameters(std=0.15, seed=seed)
    model.randomize_biases(seed)
    with torch.no_grad():
        model.head.weight.mul_(3)
    return model.eval()


def _prompts(lengths, seed=0):
    return random_prompts(lengths, VOCAB, seed)


def _params(n, max_tokens=10):
    return seeded_params(n, max_tokens)


class SelectionRecorder:
    """Records every engine forward's selections (indexer top-k, router experts) with the (sequence, start,
    length) of each chunk, by wrapping the runner's ``forward``; ``flips`` compares them with the
    learner's."""

    def __init__(self, engine: RZEngine) -> None:
        self.model = engine.model
        self.calls: list[tuple[list, list]] = []
        original = engine.runner.forward

        def forward(batch):
            self.model.selection_trace = trace = []
            try:
                return original(batch)
            finally:
                self.model.selection_trace = None
                self.calls.append(([(c.seq, c.start, c.length) for c in batch.chunks], trace))

        engine.runner.forward = forward

    def flips(self, learner: DeepseekV4ForCausalLM) -> dict[str, tuple[int, int]]:
        """Per kind ("indexer", "router"): (token rows whose selection differs from the learner's packed
        forward over the sequence's final tokens, token rows compared), over every layer."""
        refs: dict[int, list] = {}
        out: dict[str, list[int]] = {}
        for chunks, trace in self.calls:
            a = 0
            for seq, start, length in chunks:
                if seq.seq_id not in refs:
                    refs[seq.seq_id] = _selections(learner, seq.tokens)
                for (kind, got), (ref_kind, ref) in zip(trace, refs[seq.seq_id], strict=True):
                    assert kind == ref_kind
                    differ = (got[a : a + length] != ref[start : start + length]).any(dim=-1)
                    counts = out.setdefault(kind, [0, 0])
                    counts[0] += int(differ.sum())
                    counts[1] += length
                a += length
        return {k: (v[0], v[1]) for k, v in out.items()}


def _selections(model, tokens: list[int]) -> list:
    model.selection_trace = trace = []
    try:
        with torch.no_grad():
            n = len(tokens)
            model(torch.tensor(tokens), torch.arange(n), torch.zeros(n, dtype=torch.long))
    finally:
        model.selection_trace = None
    return trace


def _assert_no_flips(recorder: SelectionRecorder, learner) -> None:
    flips = recorder.flips(learner)
    assert set(flips) == {"indexer", "router"}
    for kind, (flipped, checked) in flips.items():
        assert checked > 0 and flipped == 0, (kind, flipped, checked)


def test_the_tiny_model_has_sharp_logits_and_reads_its_compressed_entries():
    """The fixture can fail: the logits are not flat, and zeroing the compressed entries in the pages mid-way
    moves the next tokens' log-probs (a cache that lost its entries would show)."""
    model = _model()
    (seq,) = _prompts([60])
    with torch.no_grad():
        logits = model.logits(model(torch.tensor(seq), torch.arange(60), torch.zeros(60, dtype=torch.long)))
    assert logits.softmax(-1).max(-1).values.mean() > 0.5
    engine = RZEngine(model, EngineConfig(max_len=128, max_batch_tokens=40, num_threads=1))
    cache = engine.kv_cache
    original = engine.runner.forward
    calls = []

    def forward(batch):
        if len(calls) == 1:  # after the first 40-token chunk: the entries are lost
            for buf in cache.entries.values():
                buf.zero_()
        calls.append(batch)
        return original(batch)

    engine.runner.forward = forward
    (out,) = generate_batch(engine, [seq], _params(1))
    (lp,) = learner_logprobs(model, [seq], [out])
    assert (out.logprobs - lp).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("batch", [1, 2, 5])
def test_engine_logprobs_and_selections_equal_the_learner_across_batch_sizes(dtype, batch):
    model = _model(dtype)
    # a 37-token budget cuts prompts inside CSA (4) and HCA (16) blocks and mixes prefill chunks with decodes
    engine = RZEngine(model, EngineConfig(max_len=160, max_batch_tokens=37, num_threads=1))
    recorder = SelectionRecorder(engine)
    prompts = _prompts([3, 63, 70, 17, 45][:batch], seed=batch)
    outs = generate_batch(engine, prompts, _params(batch))
    _assert_equal(model, prompts, outs)
    _assert_no_flips(recorder, model)
    assert engine.stats()["static_decode_steps"] > 0  # the static decode buffers ran


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefill_cut_at_every_offset_inside_compression_blocks(dtype):
    """A one-token budget prefills token by token: a cut at every offset of 2 HCA blocks and 8 CSA blocks."""
    model = _model(dtype)
    engine = RZEngine(model, EngineConfig(max_len=96, max_batch_tokens=1, num_threads=1))
    recorder = SelectionRecorder(engine)
    prompts = _prompts([35], seed=2)
    outs = generate_batch(engine, prompts, _params(1, max_tokens=4))
    _assert_equal(model, prompts, outs)
    _assert_no_flips(recorder, model)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_preemption_recomputes_the_compressed_state_exactly(dtype):
    model = _model(dtype)
    page = model.kv_page_bytes()
    # 6 pages (one the scratch page) for 4 sequences of 1-2 pages: the newest are preempted and recompute
    engine = RZEngine(model, EngineConfig(max_len=128, max_batch_tokens=48, kv_cache_bytes=6 * page))
    prompts = _prompts([50, 66, 40, 60], seed=3)
    outs = generate_batch(engine, prompts, _params(4, max_tokens=24))
    assert engine.stats()["preemptions"] > 0
    _assert_equal(model, prompts, outs)


@pytest.mark.parametrize("hca_rate", [16, 128])
def test_prefix_reuse_takes_whole_pages_and_copies_a_partial_one_exactly(hca_rate):
    """Whole pages by reference (their entries are stored in the page of their window's last token, so a
    page is a function of the tokens up to its end) and a partial page copied up to its last whole window;
    with m' = 128 an HCA window spans two pages."""
    model = _model(hca_rate=hca_rate)
    engine = RZEngine(model, EngineConfig(max_len=256, max_batch_tokens=200, num_threads=1))
    (base,) = _prompts([150], seed=4)
    first = generate_batch(engine, [base], _params(1, max_tokens=4))
    prompts = [base, base + first[0].tokens[:3], base[:101] + _prompts([30], seed=5)[0]]
    outs = generate_batch(engine, prompts, _params(3, max_tokens=4))
    assert engine.stats()["prefix_tokens_reused"] >= 128 + 64 + 37
    _assert_equal(model, [base, *prompts], [*first, *outs])


def test_a_weight_update_recomputes_running_sequences_with_the_new_weights():
    model = _model()
    new = _model(seed=1)
    engine = RZEngine(model, EngineConfig(max_len=160, max_batch_tokens=40, num_threads=1))
    assert_update_recomputes_exactly(engine, new, _prompts([70, 5, 45], seed=6), _params(3, 20), 9)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_negative_control_the_standard_op_set_differs_and_its_flip_rates(dtype, capsys):
    """The standard op set in engine and learner (the same weights): log-probs differ; its indexer and
    router flip rates are measured (printed: `pytest -s` shows them)."""
    model = _model(dtype, kernels="standard")
    engine = RZEngine(model, EngineConfig(max_len=160, max_batch_tokens=37, num_threads=1))
    recorder = SelectionRecorder(engine)
    prompts = _prompts([3, 63, 70, 17, 45], seed=7)
    outs = generate_batch(engine, prompts, _params(5))
    learner = learner_logprobs(model, prompts, outs)
    assert any(not torch.equal(o.logprobs, lp) for o, lp in zip(outs, learner, strict=True))
    flips = recorder.flips(model)
    with capsys.disabled():
        rates = {k: f"{f}/{n} = {f / n:.4f}" for k, (f, n) in flips.items()}
        print(f"\nstandard op set {dtype}: token rows whose selection flips (engine vs learner): {rates}")


def test_a_compression_rate_that_straddles_pages_unevenly_is_refused():
    model = _model(hca_rate=48)
    with pytest.raises(ValueError, match="compression rate 48 must divide"):
        model.new_kv_cache(4, "cpu")


def test_kv_page_bytes_counts_every_row_and_entry_slot():
    model = _model()
    cache = model.new_kv_cache(3, "cpu")
    assert model.kv_page_bytes() * 3 == sum(t.numel() * t.element_size() for t in cache.buffers())
    # CSA m=4: 16 entry slots per page; HCA m=16: 4
    assert cache.entries["1.indexer.entries"].shape[1] == 16
    assert cache.entries["2.compressor.entries"].shape[1] == 4
    assert dataclasses.asdict(cache.specs["2.compressor.entries"]) == {"dim": 32, "rate": 16}
