"""DeepSeek-V4's decode step is CUDA-graph capturable (model/deepseek_v4_decode.py): it reads the sliding
window, the compressors' windows and every compressed entry / indexer key up to the step's position bound
in place from the pages, in shapes fixed by (batch bucket, bound), masked per row on the device, and reads
nothing back to the host but the CPU MoE's grouping.

On CPU a graph cannot be captured, so ``ReplayEmulator`` runs each static decode step the way a replay runs
it (engine/cuda_graphs.py): the bucket's buffers filled with the step's rows, ``DecodeStep.forward`` called
with the graph's bound (``graph_max_position``) and the host positions the capture saw (all 0: a replay keeps
them), under the host-read recorder and an op trace. The first step of a (bucket, bound) stands for the
capture; every later one must run the same ops on the same shapes with the same host scalars, or it could not
be a replay of it. Log-probs: `torch.equal` to the learner's packed forward and to the eager static step (the
real top as the bound), fp32 and bf16, decode from position 2 (inside the first CSA window, before the sliding
window fills) to 150 (across page boundaries and CSA (m=4) and HCA (m'=16) blocks), with a page given back
behind the window; every indexer top-k and router pick equals the learner's. Negative controls: a mask
admitting one entry slot past the visible ones moves the log-probs; the general cached forward's op trace
changes with the positions (the trace can tell)."""

from __future__ import annotations

import contextlib
import dataclasses
import sys

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, generate_batch
from rz_agents.engine.host_reads import HostReads
from rz_agents.model.deepseek_v4_decode import PagedDecode
from tests.engine.engine_alignment import assert_equal_to_learner, learner_logprobs, seeded_params
from tests.engine.test_engine_deepseek_v4_alignment import (
    SelectionRecorder,
    _assert_no_flips,
    _model,
    _prompts,
)

CPU_MOE, MOE_DEPTH = "rz_kernels/moe.py", 24
# decode from 140 (page 0 given back behind the window at 144), 60 (across the page boundary at 64) and 2 (in
# CSA's first window, the sliding window not yet full, until 16)
LENGTHS = [140, 60, 2]
NEW = [12, 8, 16]


def _signature(x):
    """What a captured graph bakes in of an op's argument: a tensor's shape and dtype, a host value itself."""
    if isinstance(x, torch.Tensor):
        return (x.shape, x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(map(_signature, x))
    return x if isinstance(x, (int, float, bool, str, type(None), torch.dtype)) else type(x).__name__


def _inside_cpu_moe() -> bool:
    """Whether the caller runs inside the CPU op set's MoE (kernels/rz_kernels/moe.py; its expert GEMMs are a
    few frames further in, so the innermost MOE_DEPTH frames are enough)."""
    frame = sys._getframe(2)
    for _ in range(MOE_DEPTH):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith(CPU_MOE):
            return True
        frame = frame.f_back
    return False


class OpTrace(HostReads):
    """The host-read recorder that also keeps every aten op run inside, with its arguments' signatures and
    its outputs' shapes; the CPU MoE's inner ops left out (it groups the tokens by expert on the host, by
    design of the CPU op set: the Triton MoE a GPU graph captures has a launch grid fixed by the shapes,
    kernels/rz_kernels/triton_ops/moe.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if not _inside_cpu_moe():
            self.ops.append((str(func), _signature(args), _signature(kwargs or {}), _signature(out)))
        return out


class ReplayEmulator:
    """Runs the engine's static decode steps as graph replays would (see the module docstring)."""

    def __init__(
        self, engine: RZEngine, trace: bool = True, reads: bool = True, largest: bool = False
    ) -> None:
        """``trace``: record each step's op trace and host reads; ``reads``: its host reads (~0.3 s of CPU a
        step either way); ``largest``: replay the graphs of the largest bound (``capture_all``'s first)."""
        self.step, self.trace, self.record_reads = engine.runner.decode_step, trace, reads
        self.largest = largest
        self.captured: dict[tuple[int, int], list[tuple]] = {}  # (bucket, bound) -> the capture's op trace
        self.positions: dict[tuple[int, int], list[int]] = {}  # every real position replayed per key
        self.reads: list[tuple[str, str]] = []
        self.mismatches: list[tuple] = []  # (key, positions) of each step whose ops differ from the capture's
        self.step.run = self.run

    def run(self, tokens, positions, page_tables, rope_positions=None) -> torch.Tensor:
        step = self.step
        buf = step.fill(tokens, positions, page_tables, rope_positions)
        bound = step.static_max_position if self.largest else step.graph_max_position(max(positions))
        key = (buf.batch, bound)
        trace = OpTrace() if self.trace else HostReads()
        with trace if self.trace or self.record_reads else contextlib.nullcontext(), torch.inference_mode():
            out = step.forward(buf, key[1], [0] * buf.batch)
        self.reads += trace.reads
        ops = getattr(trace, "ops", [])
        if ops != self.captured.setdefault(key, ops):
            self.mismatches.append((key, list(positions)))  # (the engine would retry a raising step alone)
        self.positions.setdefault(key, []).extend(positions)
        return out[: len(tokens)]


def _params(new=NEW):
    params = seeded_params(len(new), 1)
    return [dataclasses.replace(p, ignore_eos=True, max_tokens=n) for p, n in zip(params, new, strict=True)]


def _engine(model, **cfg) -> RZEngine:
    return RZEngine(model, EngineConfig(max_len=256, num_threads=1, **cfg))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_replayed_decode_steps_equal_the_learner_and_the_eager_step_with_one_trace_per_bucket(dtype):
    model = _model(dtype)
    prompts = _prompts(LENGTHS, seed=11)
    graphed = _engine(model)
    # the op trace (dtype-blind) in the fp32 run only: it costs ~0.3 s of CPU per step
    emulator, recorder = ReplayEmulator(graphed, trace=dtype == "float32"), SelectionRecorder(graphed)
    outs = generate_batch(graphed, prompts, _params())
    assert_equal_to_learner(model, prompts, outs)
    _assert_no_flips(recorder, model)
    eager = generate_batch(_engine(model), prompts, _params())  # DecodeStep.run: the real top as the bound
    for a, b in zip(outs, eager, strict=True):
        assert a.tokens == b.tokens and torch.equal(a.logprobs, b.logprobs)
    stats = graphed.stats()
    assert stats["kv_pages_released_behind_window"] >= 1 and stats["static_decode_steps"] >= 14, stats
    # every step replayed its bucket's one capture: buckets 4 (3 rows + padding), 2 and 1 at bound 255
    assert sorted(emulator.captured) == [(1, 255), (2, 255), (4, 255)] and emulator.mismatches == []
    assert all(emulator.captured.values()) == emulator.trace
    seen = set().union(*map(set, emulator.positions.values()))
    assert min(seen) == 2 and max(seen) == 150 and {15, 16, 63, 64, 143, 144} <= seen
    assert [w for w in emulator.reads if not w[1].startswith("moe.py:")] == []


def test_negative_control_a_mask_admitting_one_entry_slot_too_many_moves_the_logprobs(monkeypatch):
    entries = PagedDecode.entries

    def one_too_many(self, key, rate, picks=None):
        out, visible = entries(self, key, rate, picks)
        if picks is not None:  # (the indexer's picks of its candidates: the admitted slot is among those)
            return out, visible
        limit = visible.sum(-1, keepdim=True)  # (on the device: no read)
        return out, visible | (torch.arange(visible.shape[1]).unsqueeze(0) == limit)

    model = _model("float32")
    prompts = _prompts([40], seed=11)
    monkeypatch.setattr(PagedDecode, "entries", one_too_many)
    engine = _engine(model)
    ReplayEmulator(engine, trace=False, reads=False)
    outs = generate_batch(engine, prompts, _params([8]))
    for o, lp in zip(outs, learner_logprobs(model, prompts, outs), strict=True):
        assert (o.logprobs - lp).abs().max() > 1e-3


@pytest.mark.parametrize("static_decode", [True, False])
def test_an_hca_window_spanning_two_pages_completes_inside_a_decode_step(static_decode):
    """HCA m' = 128: a window's entry lives in its last page's one slot; decoding 120..131 pools window 0
    partially into page 1's slot until its last token (127) completes it, then window 1's partial pools land
    in page 2's unused slot. Replayed steps (static) and the runner's one-token-per-row forward (its page
    tables padded with page 0, not the scratch page) both equal the learner."""
    model = _model("float32", hca_rate=128)
    prompts = _prompts([120], seed=12)
    engine = _engine(model, static_decode=static_decode)
    if static_decode:
        ReplayEmulator(engine, trace=False, reads=False)
    outs = generate_batch(engine, prompts, _params([12]))
    assert_equal_to_learner(model, prompts, outs)
    assert engine.stats()["static_decode_steps"] == (11 if static_decode else 0)


def test_a_replay_at_a_far_larger_bound_reads_many_padded_entry_blocks_and_keeps_the_bits():
    """The graphs of a 2,048-position bound replayed at positions 2..75: HCA (m'=16) reads 128 entry slots
    (two of its 64-entry summation blocks, the learner one), the indexer ranks 512 candidates (the learner
    at most 19): every padded slot masked, the log-probs the learner's."""
    model = _model("float32", max_position_embeddings=2048)
    prompts = _prompts([70, 2], seed=13)
    engine = RZEngine(model, EngineConfig(max_len=2048, num_threads=1))
    replays = ReplayEmulator(engine, trace=False, reads=False, largest=True)
    outs = generate_batch(engine, prompts, _params([6, 6]))
    assert_equal_to_learner(model, prompts, outs)
    assert {bound for _, bound in replays.captured} == {2047}


def test_the_op_trace_tells_a_step_whose_shapes_follow_its_positions():
    """The general cached forward (a SequenceState per row, sized by the host positions) run at positions 20
    and 21 traces other ops: the emulator's comparison would refuse it."""
    model = _model("float32")
    cache = model.new_kv_cache(3, "cpu")
    traces = []
    for p in (20, 21):
        view = cache.view(torch.tensor([[0, 1]]), max_position=p)  # no decode_positions: the general forward
        with OpTrace() as trace, torch.inference_mode():
            model(torch.tensor([5]), torch.tensor([p]), seq_ids=torch.tensor([0]), kv_cache=view)
        traces.append(trace.ops)
    assert traces[0] != traces[1]


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


@needs_cuda
def test_cuda_graph_replays_equal_eager_decode_and_the_learner_on_cuda():
    model = _model("bfloat16").cuda()
    prompts = _prompts(LENGTHS, seed=11)
    graphed = _engine(model, cuda_graphs=True)
    outs = generate_batch(graphed, prompts, _params())
    assert graphed.stats()["cuda_graphs"], graphed.stats()["cuda_graphs_off"]
    assert graphed.graphs.captures >= 1 and graphed.graphs.replays >= 14
    assert_equal_to_learner(model, prompts, outs)
    eager = generate_batch(_engine(model, cuda_graphs=False), prompts, _params())
    for a, b in zip(outs, eager, strict=True):
        assert a.tokens == b.tokens and torch.equal(a.logprobs, b.logprobs)
