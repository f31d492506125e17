"""DeepSeek-V4's discrete selections never flip on the aligned op set: a sequence's indexer top-k blocks, its
routers' experts and its logits have the same bits in the learner's packed forward, alone, packed with other
sequences in any order, and over any prefix cut (inside a CSA block and inside an HCA block included), in fp32
and bf16. The standard op set's flip counts and log-prob differences over the same runs are measured beside
them (printed; its log-probs differ, the negative control)."""

from __future__ import annotations

import pytest
import torch

from rz_agents.model.deepseek_v4 import DeepseekV4ForCausalLM
from rz_agents.model.deepseek_v4_config import DeepseekV4Config
from rz_kernels import sparse_select

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 128
LENS = [97, 61, 130]
# cuts of sequence 0: inside the first CSA block (rate 4), inside an HCA block (rate 16), past the window
CUTS = [1, 6, 23, 41, 97]


def _config(dtype: str) -> DeepseekV4Config:
    layers = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
              "compressed_sparse_attention")  # fmt: skip
    return DeepseekV4Config(
        vocab_size=VOCAB, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, head_dim=32, q_lora_rank=24, num_experts_per_tok=2, n_routed_experts=8,
        layer_types=layers,
        mlp_layer_types=("hash_moe", "moe", "moe", "moe"), csa_rate=4, hca_rate=16, qk_rope_head_dim=16,
        hc_mult=4, hc_sinkhorn_iters=6, sliding_window=16, o_groups=2, o_lora_rank=16,
        # two indexer heads: scores of exactly 0 (every head's relu 0) are common, so ties at the selection
        # boundary occur and are broken the same way in every call (lowest block first)
        index_n_heads=2, index_head_dim=32, index_topk=4, max_position_embeddings=512, dtype=dtype,
        hf={"model_type": "deepseek_v4"},
    )  # fmt: skip


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def model(request):
    torch.manual_seed(0)
    m = DeepseekV4ForCausalLM(_config(request.param))
    m.reset_parameters(std=0.15, seed=0)
    with torch.no_grad():  # random selection biases, sinks and position biases (their init is zero)
        for name, p in m.named_parameters():
            if name.endswith(("attn_sink", ".ape", "_base")):
                p.copy_(torch.randn(p.shape) * 0.5)
        for name, b in m.named_buffers():
            if name.endswith("gate.bias"):
                b.copy_(torch.randn(b.shape) * 0.1)
    return m.eval()


@pytest.fixture(scope="module")
def sequences():
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (n,), generator=gen) for n in LENS]


def _run(model, seqs):
    """Per sequence: (logp [n, vocab], selections [(kind, [n, k]) per selecting layer])."""
    lens = [s.numel() for s in seqs]
    tokens = torch.cat(seqs)
    positions = torch.cat([torch.arange(n) for n in lens])
    seq_ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])
    model.selection_trace = trace = []
    try:
        with torch.no_grad():
            logp = model.logits(model(tokens, positions, seq_ids)).log_softmax(-1)
    finally:
        model.selection_trace = None
    out = []
    for i, part in enumerate(torch.split(logp, lens)):
        a = sum(lens[:i])
        out.append((part, [(kind, sel[a : a + lens[i]]) for kind, sel in trace]))
    return out


def _variants(seqs):
    """(name, sequences, index of sequence 0's tokens, cut) of each forward sequence 0 appears in."""
    a, b, c = seqs
    yield "alone", [a], 0, None
    yield "packed after others", [c, b, a], 2, None
    yield "packed between", [b, a, c], 1, None
    for cut in CUTS:
        yield f"prefix {cut}", [a[:cut], c], 0, cut
    yield "prefix 3 alone (no complete window)", [a[:3]], 0, 3


def _compare(model, seqs):
    """(flips per kind, same-set order changes, rows compared per kind, max |dlogp|, whether logits were
    bit-equal everywhere) against the packed learner forward of all three sequences."""
    ref_logp, ref_sel = _run(model, seqs)[0]
    flips = {"indexer": 0, "router": 0, "order": 0}
    rows = {"indexer": 0, "router": 0}
    worst, equal = 0.0, True
    for _, group, index, cut in _variants(seqs):
        logp, sel = _run(model, group)[index]
        n = logp.shape[0] if cut is None else cut
        worst = max(worst, (logp[:n] - ref_logp[:n]).abs().max().item())
        equal = equal and torch.equal(logp[:n], ref_logp[:n])
        for (kind, mine), (_, ref) in zip(sel, ref_sel, strict=True):
            # a flip: a token whose selected set differs (an order change of the same set is counted apart)
            moved = (mine[:n].sort(-1).values != ref[:n].sort(-1).values).any(-1)
            flips[kind] += int(moved.sum())
            flips["order"] += int(((mine[:n] != ref[:n]).any(-1) & ~moved).sum())
            rows[kind] += n
    return flips, rows, worst, equal


def test_aligned_selections_and_logits_never_move(model, sequences):
    model.set_kernels("aligned")
    flips, rows, worst, equal = _compare(model, sequences)
    print(f"\n{model.config.dtype} aligned: flips {flips} of rows {rows}, max |dlogp| {worst:.3g}")
    assert flips == {"indexer": 0, "router": 0, "order": 0}
    assert equal and worst == 0.0


def test_standard_op_set_measured(model, sequences):
    """The standard op set over the same runs: its log-probs move with the batch (the negative control);
    its flip counts are reported."""
    model.set_kernels("standard")
    try:
        flips, rows, worst, equal = _compare(model, sequences)
    finally:
        model.set_kernels("aligned")
    print(f"\n{model.config.dtype} standard: flips {flips} of rows {rows}, max |dlogp| {worst:.3g}")
    assert not equal and worst > 0.0


def test_top_k_ties_go_to_the_lowest_block_and_invisible_blocks_are_none():
    scores = torch.tensor(
        [[0.0, 2.0, 0.0, 0.0, float("-inf")], [1.0, float("-inf"), float("-inf"), 1.0, 1.0]]
    )
    assert sparse_select.aligned_top_k(scores, 3).tolist() == [[1, 0, 2], [0, 3, 4]]
    assert sparse_select.aligned_top_k(scores[:, :2], 3).tolist() == [[1, 0, -1], [0, -1, -1]]


def _cached_run(model, seqs, schedules):
    """Each sequence through chunked prefill then one-token decodes (its own `schedules` of chunk sizes,
    all sequences of a step in one call): per sequence (logp rows, selections) in position order."""
    from rz_agents.model.deepseek_v4_attention import SequenceState

    states = [SequenceState() for _ in seqs]
    done = [0] * len(seqs)
    logps = [[] for _ in seqs]
    sels = [[] for _ in seqs]
    step = 0
    while any(d < s.numel() for d, s in zip(done, seqs, strict=True)):
        chunks = []
        for i, s in enumerate(seqs):
            n = schedules[i][step] if step < len(schedules[i]) else 1
            chunks.append(min(n, s.numel() - done[i]))
        live = [i for i, n in enumerate(chunks) if n]
        tokens = torch.cat([seqs[i][done[i] : done[i] + chunks[i]] for i in live])
        positions = torch.cat([torch.arange(done[i], done[i] + chunks[i]) for i in live])
        seq_ids = torch.cat([torch.full((chunks[i],), j) for j, i in enumerate(live)])
        model.selection_trace = trace = []
        try:
            with torch.no_grad():
                logp = model.logits(model(tokens, positions, seq_ids, states=[states[i] for i in live]))
        finally:
            model.selection_trace = None
        a = 0
        for i in live:
            logps[i].append(logp[a : a + chunks[i]].log_softmax(-1))
            sels[i].append([(kind, sel[a : a + chunks[i]]) for kind, sel in trace])
            a += chunks[i]
            done[i] += chunks[i]
        step += 1
    out = []
    for i in range(len(seqs)):
        layers = len(sels[i][0])
        merged = [(sels[i][0][j][0], torch.cat([c[j][1] for c in sels[i]])) for j in range(layers)]
        out.append((torch.cat(logps[i]), merged))
    return out, states


def test_chunked_prefill_and_decode_give_the_packed_forwards_bits(model, sequences):
    """Standalone cached inference (per-sequence states): chunk cuts inside CSA and HCA blocks, then one-token
    decodes, sequences batched with each other at different positions: every position's log-probs and
    selections equal the learner's packed forward bit for bit, while each state holds only the rows a later
    token still reads and the pooled entries."""
    model.set_kernels("aligned")
    a, b, _ = sequences
    seqs = [a[:70], b[:45]]
    ref = _run(model, seqs)
    cached, states = _cached_run(model, seqs, [[5, 11, 3, 22], [1, 17, 6]])
    for (ref_logp, ref_sel), (logp, sel) in zip(ref, cached, strict=True):
        assert torch.equal(logp, ref_logp)
        assert all(torch.equal(x, y) for (_, x), (_, y) in zip(sel, ref_sel, strict=True))
    # the states are bounded: rows for the last window's positions only (here <= 15), one entry per window
    for st, seq in zip(states, seqs, strict=True):
        assert st.position == seq.numel() and 0 < st.position - st.start <= 15
        assert all(rows.shape[0] == st.position - st.start for rows in st.rows.values())
        assert st.entries["2.compressor.entries"].shape[0] == seq.numel() // 16
        assert st.entries["1.indexer.entries"].shape[0] == seq.numel() // 4


def test_a_stream_whose_sequence_skips_positions_is_refused(model):
    with pytest.raises(ValueError, match="positions must run from 0"):
        model(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3]), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="takes seq_ids"):  # the engine's call names each token's table row
        model(torch.tensor([1]), torch.tensor([0]), kv_cache=object())
