"""CUDA-graph decode: bucket choice, static buffers reused in place, padding that changes no real row,
weights loaded in place, the config on CPU; capture + replay == eager bit for bit (needs CUDA)."""

from __future__ import annotations

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams, generate_batch
from rz_agents.engine.cuda_graphs import CaptureRefused, DecodeGraphs, warm_up, weight_addresses
from rz_agents.engine.decode_step import DecodeStep
from rz_agents.model import KVCache


def _step(model, max_batch=16, width=4, device="cpu") -> DecodeStep:
    pages = 12
    cache = KVCache(model.config, num_pages=pages + 1, device=device)
    return DecodeStep(model, cache, max_batch=max_batch, width=width, scratch_page=pages)


def _prefill(step: DecodeStep, prompts, tables):
    """Write each prompt's K/V into its pages (one eager forward per sequence)."""
    with torch.inference_mode():
        for prompt, table in zip(prompts, tables, strict=True):
            n = len(prompt)
            view = step.cache.view(torch.tensor([table], device=step.cache.device), n - 1)
            dev = step.cache.device
            step.model(
                torch.tensor(prompt, device=dev),
                torch.arange(n, device=dev),
                seq_ids=torch.zeros(n, dtype=torch.long, device=dev),
                kv_cache=view,
            )


ROWS = dict(tokens=[5, 17, 3], positions=[9, 70, 130], tables=[[0], [1, 2], [3, 4, 5]])


def _prompts(vocab: int):
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (p,), generator=gen).tolist() for p in ROWS["positions"]]


def test_the_graph_bucket_of_a_batch_is_the_smallest_that_holds_it(tiny_model):
    step = _step(tiny_model(), max_batch=20)
    assert step.buckets == [1, 2, 4, 8, 16, 20]
    assert [step.bucket(n) for n in (1, 2, 3, 4, 5, 9, 16, 17, 20)] == [1, 2, 4, 4, 8, 16, 16, 20, 20]
    with pytest.raises(ValueError, match="exceeds the largest bucket 20"):
        step.bucket(21)


def test_a_bucket_reuses_its_buffers_in_place_whatever_the_rows_and_pages(tiny_model):
    # A graph replays fixed addresses: the same tensors must carry every step's tokens, positions and
    # page tables (new page placements after preemption are buffer contents, not new tensors).
    step = _step(tiny_model())
    a = step.fill([1, 2, 3], [4, 5, 6], [[0], [1], [2]])
    ptrs = (a.device.data_ptr(), a.host.data_ptr(), a.page_table.data_ptr(), a.positions.data_ptr())
    b = step.fill([7, 8], [64, 65], [[3, 4], [5, 6]])  # 2 rows: bucket 2, other buffers
    c = step.fill([9, 10, 11, 12], [1, 2, 70, 3], [[7], [8], [9, 10], [11]])  # bucket 4 again
    assert b is not a and c is a
    assert (c.device.data_ptr(), c.host.data_ptr(), c.page_table.data_ptr(), c.positions.data_ptr()) == ptrs
    assert c.tokens.tolist() == [9, 10, 11, 12] and c.page_table[2, :2].tolist() == [9, 10]
    # rows past the real ones are padding: token 0 at position 0 on the scratch page
    d = step.fill([1], [3], [[2]])
    assert d.batch == 1
    step.fill([1, 2, 3], [4, 5, 6], [[0], [1], [2]])
    assert a.positions[3].item() == 0 and a.page_table[3].tolist() == [step.scratch_page] * 4


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_moe"])
def test_padding_rows_change_no_bit_of_the_real_rows(tiny_model, model_type):
    # The same 3 rows alone (unpadded, the plain model forward) and padded to buckets of 4 and 16.
    model = tiny_model(model_type)
    prompts = _prompts(model.config.vocab_size)
    ref_step = _step(model)
    _prefill(ref_step, prompts, ROWS["tables"])
    with torch.inference_mode():
        table = torch.tensor([t + [0] * (4 - len(t)) for t in ROWS["tables"]])
        alone = model(
            torch.tensor(ROWS["tokens"]),
            torch.tensor(ROWS["positions"]),
            seq_ids=torch.arange(3),
            kv_cache=ref_step.cache.view(table, max(ROWS["positions"])),
        )
    for buckets in ([1, 2, 4, 8, 16], [16]):
        step = _step(model)
        _prefill(step, prompts, ROWS["tables"])
        step.buckets = buckets
        got = step.run(ROWS["tokens"], ROWS["positions"], ROWS["tables"])
        assert step.bucket(3) == buckets[0 if len(buckets) == 1 else 2]
        assert torch.equal(got, alone)
    # negative control: the standard op set's rows are not those of the aligned one
    model.set_kernels("standard")
    step = _step(model)
    _prefill(step, prompts, ROWS["tables"])
    assert not torch.equal(step.run(ROWS["tokens"], ROWS["positions"], ROWS["tables"]), alone)
    model.set_kernels("aligned")


def test_cuda_graphs_on_cpu_are_ignored_and_the_engine_says_why(tiny_model):
    model = tiny_model()
    engine = RZEngine(model, EngineConfig(max_running=4, max_len=128, num_threads=1))
    assert engine.config.cuda_graphs is True and engine.graphs is None
    stats = engine.stats()
    assert stats["cuda_graphs"] is False and "CUDA graphs need a CUDA device" in stats["cuda_graphs_off"]
    off = RZEngine(model, EngineConfig(max_running=4, max_len=128, static_decode=False, num_threads=1))
    assert "static_decode is false" in off.stats()["cuda_graphs_off"]
    with pytest.raises(ValueError, match="EngineConfig.cuda_graphs must be true or false"):
        EngineConfig(cuda_graphs="yes")
    with pytest.raises(ValueError, match="need the KV cache on a CUDA device"):
        DecodeGraphs(_step(model))


def test_a_weight_update_keeps_every_parameter_in_its_storage(tiny_model, perturbed_state):
    # Captured graphs hold the weights' addresses: load_weights copies in place, so they stay valid.
    for model_type in ("qwen3", "qwen3_moe"):
        model = tiny_model(model_type, tie_word_embeddings=True)
        engine = RZEngine(model, EngineConfig(max_running=4, max_len=128, num_threads=1))
        before = weight_addresses(model)
        engine.load_weights(perturbed_state(model, seed=1), version=1)
        assert weight_addresses(model) == before
        assert engine.version == 1
    # negative control: a parameter replaced by a new tensor is seen
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    assert weight_addresses(model) != before


def test_a_step_that_would_sync_is_refused_before_capture_with_its_location(tiny_model, monkeypatch):
    # The warm-up before a capture runs under the host-read recorder: the dense step passes; a step
    # whose forward reads a value back (here an injected int() of a device tensor, what the MoE's host
    # grouping does) is refused with where it reads, so no capture is attempted.
    step = _step(tiny_model())
    warm_up(step, step.buffers(4))
    forward = step.model.forward

    def reading_forward(tokens, *args, **kwargs):
        int(tokens.sum())
        return forward(tokens, *args, **kwargs)

    monkeypatch.setattr(step.model, "forward", reading_forward)
    with pytest.raises(CaptureRefused, match=r"reads back from the device \(item at decode_step.py"):
        warm_up(step, step.buffers(4))


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


@needs_cuda
def test_graph_replay_equals_eager_decode_bit_for_bit_on_cuda(tiny_model, perturbed_state):
    model = tiny_model(dtype="bfloat16").cuda()
    prompts = _prompts(model.config.vocab_size)
    eager, graphed = _step(model, device="cuda"), _step(model, device="cuda")
    for step in (eager, graphed):
        _prefill(step, prompts, ROWS["tables"])
    graphs = DecodeGraphs(graphed)
    for _ in range(2):  # the second replays the captured graph
        a = eager.run(ROWS["tokens"], ROWS["positions"], ROWS["tables"])
        b = graphs.run(ROWS["tokens"], ROWS["positions"], ROWS["tables"])
        assert graphs.disabled_reason is None and graphs.captured == [4]
        assert torch.equal(a, b)
    assert graphs.captures == 1 and graphs.replays == 2
    # weights loaded in place keep the graph valid: replay == eager with the new weights
    with torch.no_grad():
        for name, value in perturbed_state(model, seed=2).items():
            dict(model.named_parameters())[name].copy_(value)
    assert graphs.check_weights()
    positions = [p + 1 for p in ROWS["positions"]]
    assert torch.equal(
        eager.run(ROWS["tokens"], positions, ROWS["tables"]),
        graphs.run(ROWS["tokens"], positions, ROWS["tables"]),
    )


@needs_cuda
def test_engine_with_cuda_graphs_samples_what_the_eager_engine_samples(tiny_model):
    model = tiny_model(dtype="bfloat16").cuda()
    prompts = _prompts(model.config.vocab_size)
    params = [SamplingParams(temperature=1.0, max_tokens=12, seed=i, ignore_eos=True) for i in range(3)]
    cfg = dict(max_running=8, max_len=256, num_threads=1)
    graphed = RZEngine(model, EngineConfig(cuda_graphs=True, **cfg))
    eager = RZEngine(model, EngineConfig(cuda_graphs=False, **cfg))
    a, b = generate_batch(graphed, prompts, params), generate_batch(eager, prompts, params)
    assert graphed.stats()["cuda_graphs"] and graphed.graphs.replays > 0
    for x, y in zip(a, b, strict=True):
        assert x.tokens == y.tokens and torch.equal(x.logprobs, y.logprobs)
