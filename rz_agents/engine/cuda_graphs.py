"""CUDA-graph decode: the static decode step captured once per batch bucket and replayed.

``DecodeStep.forward`` (rz_agents.engine.decode_step) is the function every device runs eagerly and
the one captured here: the same code over the same static buffers, so what the CPU tests prove about
it (padding changes no bit of the real rows, no read-back to the host) holds for the replay.

One graph per (batch bucket, position bound), on first use: the bound is the step's highest position rounded
up by ``DecodeStep.graph_max_position`` (a power-of-two number of 512-key attention splits, at most
``static_max_position``), so the attention's decode grid follows the batch's real longest context, not
max_len, from a few graphs per bucket. Per graph, on first use: the buffers are filled with padding rows (all
on the scratch page, so the warm-up writes no real sequence's K/V), the step runs twice on a side stream
(Triton JIT, lazily made device tables such as RoPE's, allocator warm-up; the first run under the host-read
recorder, rz_agents.engine.host_reads, so a step that would sync is refused with its location instead of
breaking a capture), then once under capture. Every graph allocates from
one shared memory pool; that is safe because a replay's output is read (LM head, sampler) before the
next replay is launched, on the same stream. A replay: ``DecodeStep.fill`` writes the step's
metadata into the bucket's pinned host buffer and uploads it with one non-blocking copy (stream
ordered before the replay), then the graph runs and its static output's first n rows are returned.

What keeps a graph valid: it holds the addresses of the weights, the KV pages and the buffers.
Weights are loaded in place (``ModelRunner.load_state`` copies into the parameters' storage) and
``check_weights`` drops every graph (recaptured on next use) if a parameter's storage moved anyway;
the page tables are buffer contents, so preemption, re-admission and new page placements need no
recapture. A graph replays the op set it was captured with: switching the model's kernels drops them. Captures
run in CUDA's thread-local capture mode, so a learner stepping in another thread of the process (``runtime:
local``) can allocate or synchronize during a capture without breaking it (issue 54). A step
that reads back (e.g. an MoE still grouping experts on the host) or a capture that fails turns graphs off for
this engine with a logged reason, and decode runs eagerly (same bits).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rz_agents.engine.decode_step import DecodeStep
from rz_agents.engine.host_reads import HostReads

log = logging.getLogger(__name__)

# Which threads' unsafe CUDA calls break a capture: only the capturing thread's (see DecodeGraphs.capture).
CAPTURE_ERROR_MODE = "thread_local"


def weight_addresses(model: torch.nn.Module) -> dict[str, int]:
    """Storage address of every parameter and buffer by name: what a captured graph has baked in."""
    named = dict(model.named_parameters(remove_duplicate=False))
    named.update(dict(model.named_buffers(remove_duplicate=False)))
    return {name: t.data_ptr() for name, t in named.items()}


class CaptureRefused(RuntimeError):
    """The decode step reads a device value back to the host: it cannot be captured."""


def warm_up(step: DecodeStep, buf) -> None:
    """Run ``step.forward`` once over ``buf`` (padding rows) under the host-read recorder; raise
    CaptureRefused naming the first read if it made any (a capture would fail there, or bake it in)."""
    with HostReads() as rec, torch.inference_mode():
        step.forward(buf, step.static_max_position, [0] * buf.batch)
    if rec.reads:
        op, where = rec.reads[0]
        raise CaptureRefused(f"the decode step reads back from the device ({op} at {where})")


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    output: torch.Tensor  # [bucket, hidden]: written by every replay


class DecodeGraphs:
    """Captures ``step.forward`` per bucket on first use and replays it (CUDA only)."""

    def __init__(self, step: DecodeStep) -> None:
        if step.cache.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the KV cache on a CUDA device, got {step.cache.device}")
        self.step = step
        self.device = step.cache.device
        self._graphs: dict[tuple[int, int], _Graph] = {}  # (bucket, position bound) -> graph
        self._pool = None
        self._weights = weight_addresses(step.model)
        self._kernels = getattr(step.model, "kernels", None)  # a graph replays the op set it captured
        self.disabled_reason: str | None = None
        self.captures = 0
        self.replays = 0

    @property
    def captured(self) -> list[int]:
        """Buckets with a captured graph (at any position bound), ascending."""
        return sorted({bucket for bucket, _ in self._graphs})

    @property
    def captured_keys(self) -> list[tuple[int, int]]:
        """(bucket, position bound) of every captured graph, ascending."""
        return sorted(self._graphs)

    def check_weights(self) -> bool:
        """After a weight update: True if every parameter kept its storage (graphs stay valid); else
        every graph is dropped (recaptured on next use) and False is returned."""
        now = weight_addresses(self.step.model)
        if now == self._weights:
            return True
        moved = [n for n, p in now.items() if self._weights.get(n) != p]
        log.warning("CUDA graphs: %d parameters changed storage (%s ...): recapturing", len(moved), moved[:3])
        self._graphs.clear()
        self._weights = now
        return False

    @torch.inference_mode()
    def capture(self, bucket: int, max_position: int | None = None) -> None:
        """Capture the graph of ``bucket`` at the position bound ``max_position`` (one of
        ``step.graph_bounds()``; default the largest); a no-op if captured. Raises what the capture raised."""
        step = self.step
        max_position = step.static_max_position if max_position is None else max_position
        if max_position not in step.graph_bounds():
            raise ValueError(
                f"a graph's position bound must be one of {step.graph_bounds()}, got {max_position}"
            )
        key = (bucket, max_position)
        if key in self._graphs:
            return
        buf = step.buffers(bucket)
        step.fill_padding(buf)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            warm_up(step, buf)  # raises, capturing nothing, if the step would sync
            step.forward(buf, max_position, [0] * bucket)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local, not the default "global": with `runtime: local` the learner steps in another thread of
        # this process, and under "global" any CUDA call it makes that is unsafe during a capture (a
        # cudaMalloc, a sync) invalidates this capture (graphs then off) or fails in the learner. Only this
        # thread's calls can break the capture (its own step is checked for syncs by warm_up).
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode=CAPTURE_ERROR_MODE):
            output = step.forward(buf, max_position, [0] * bucket)
        self._graphs[key] = _Graph(graph, output)
        self.captures += 1

    def capture_all(self) -> None:
        """Capture every bucket at every position bound now, largest first (the pool then serves the
        smaller ones)."""
        for bucket in reversed(self.step.buckets):
            for bound in reversed(self.step.graph_bounds()):
                self.capture(bucket, bound)

    @torch.inference_mode()
    def run(
        self,
        tokens: list[int],
        positions: list[int],
        page_tables: Sequence[Sequence[int]],
        rope_positions: list[int] | None = None,
    ) -> torch.Tensor:
        """Hidden states [n, hidden] of n decode rows: a replay of their bucket's graph (captured on
        first use); eager ``DecodeStep.run`` once graphs are off for this engine. ``rope_positions``: the
        rows' RoPE positions (None: the positions; ``DecodeStep.fill``)."""
        if self.disabled_reason is not None:
            return self.step.run(tokens, positions, page_tables, rope_positions)
        kernels = getattr(self.step.model, "kernels", None)
        if kernels != self._kernels:  # set_kernels since the captures: they replay the old op set
            self._graphs.clear()
            self._kernels = kernels
        if not tokens or max(positions) > self.step.static_max_position:
            return self.step.run(tokens, positions, page_tables, rope_positions)  # (raises its clear error)
        bucket = self.step.bucket(len(tokens))
        bound = self.step.graph_max_position(max(positions))
        if (bucket, bound) not in self._graphs:
            try:
                self.capture(bucket, bound)
            except Exception as e:  # noqa: BLE001 - any capture failure: eager decode, same bits
                self.disabled_reason = f"capture of bucket {bucket} (positions <= {bound}) failed: {e!r}"
                log.warning("CUDA graphs off for this engine (decode runs eagerly): %s", self.disabled_reason)
                self._graphs.clear()
                torch.cuda.synchronize(self.device)
                return self.step.run(tokens, positions, page_tables, rope_positions)
        # one pinned upload, ordered before the replay
        self.step.fill(tokens, positions, page_tables, rope_positions)
        got = self._graphs[(bucket, bound)]
        got.graph.replay()
        self.replays += 1
        return got.output[: len(tokens)]
