"""The engine's paged cache of a hybrid linear-attention model (Qwen3.5): one page = 64 positions = one
delta-rule chunk, so every kind of per-sequence state lives in the sequence's pages.

Per page, for each layer of its kind:
- full attention: the K/V of its 64 positions (as ``KVCache``'s pages);
- Gated DeltaNet: per position, the short conv's input (the q/k/v projection) and the delta rule's log decay
  g and beta (fp32). The k and v of a chunk being recomputed are recomputed from the conv inputs (per-token
  arithmetic: the same bits), not stored.
- Beside the pages, fewer state snapshots than pages (one slot per ``snapshot_every`` pages: the fp32
  [heads, dk, dv] delta-rule state after a page's chunk, every Gated DeltaNet layer), held by the pages a
  forward chose (model/qwen3_5_snapshots.py: a running sequence's last completed chunk, every Nth chunk).

A forward continuing a sequence at position p reads the conv window (positions p-K+1..p-1), the latest
snapshot at or before chunk p // 64 - 1 in the sequence's pages (or the zero state at its start), and the
inputs of every token after that snapshot from the pages, which is what the aligned delta rule keeps between
calls (rz_kernels.delta_rule.DeltaRuleCache, whose pending tokens may span several chunks): a prefill cut
anywhere, a decode step and the learner's packed forward give every token the same bits. So the engine's
page machinery works unchanged: preemption and weight updates (recompute) refill the pages, and prefix reuse
takes whole pages by reference (their inputs, and any snapshot they hold, are the prefix's, as the hash
chain over the pages names every token before them) and copies a partial page's positions. The price is
memory (the per-position inputs, and the snapshots: ``hybrid_page_terms``) and, where a snapshot was not
kept, recomputing the chunks after the latest one.
"""

from __future__ import annotations

import torch

from rz_agents.model.kv_cache import PAGE_SIZE, KVCache
from rz_agents.model.qwen3_5_config import Qwen35Config
from rz_agents.model.qwen3_5_snapshots import SnapshotSlots

F32 = torch.float32
# One delta-rule state snapshot slot per this many pages: the 4B's page in bf16 is 74.4 MiB with a snapshot
# per page and 38.4 MiB with one per four (the state is 48 MiB of the 74.4); a resume point without a kept
# snapshot recomputes at most (snapshot_every - 1) chunks when the slots hold their anchors.
SNAPSHOT_EVERY = 4


def snapshot_slots(num_pages: int, snapshot_every: int = SNAPSHOT_EVERY) -> int:
    """State snapshot slots of a cache of ``num_pages`` pages (at least one)."""
    return max(1, num_pages // snapshot_every)


def hybrid_page_terms(
    config: Qwen35Config, dtype: torch.dtype | None = None, snapshot_every: int = SNAPSHOT_EVERY
) -> dict[str, int]:
    """Bytes one page (64 positions) holds over all layers, by what they are: ``kv`` (the full-attention
    layers' K/V), ``recurrent_inputs`` (each Gated DeltaNet layer's per-position conv input, g and beta) and
    ``state_snapshots`` (its share of the snapshot slots: each Gated DeltaNet layer's fp32 delta-rule state,
    one slot per ``snapshot_every`` pages)."""
    item = torch.empty(0, dtype=dtype or config.torch_dtype).element_size()
    full = config.layer_types.count("full_attention")
    linear = config.num_hidden_layers - full
    hv, dk, dv = config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim
    return {
        "kv": full * 2 * config.num_key_value_heads * PAGE_SIZE * config.head_dim * item,
        "recurrent_inputs": linear * PAGE_SIZE * (config.conv_dim * item + 4 * hv * 2),
        "state_snapshots": linear * 4 * hv * dk * dv // snapshot_every,
    }


def hybrid_bytes_per_page(
    config: Qwen35Config, dtype: torch.dtype | None = None, snapshot_every: int = SNAPSHOT_EVERY
) -> int:
    """Bytes one page (64 positions) holds over all layers (the sum of ``hybrid_page_terms``)."""
    return sum(hybrid_page_terms(config, dtype, snapshot_every).values())


def sequence_state_bytes(config: Qwen35Config, dtype: torch.dtype | None = None) -> int:
    """Bytes of one sequence's live recurrent state in one Gated DeltaNet layer while a forward continues it:
    the delta-rule state read from its page snapshot and the one the chunks advance (fp32 [heads, dk, dv]
    each) and the conv window (K - 1 positions of conv input). A forward holds this for every sequence of
    the step, one layer at a time (the pages keep the rest)."""
    item = torch.empty(0, dtype=dtype or config.torch_dtype).element_size()
    hv, dk, dv = config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim
    return 2 * 4 * hv * dk * dv + (config.linear_conv_kernel_dim - 1) * config.conv_dim * item


class HybridCache:
    """The pages of a hybrid model's cache (see the module docstring); ``view`` and ``copy_page`` as
    ``KVCache``'s. Tensors per layer index: ``k``/``v`` for full-attention layers; ``conv_in``, ``dr_g``,
    ``dr_beta`` (per position) and ``state`` (per snapshot slot: ``slots`` maps pages to them) for Gated
    DeltaNet layers."""

    def __init__(
        self,
        config: Qwen35Config,
        num_pages: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str = "cpu",
        snapshot_every: int = SNAPSHOT_EVERY,
    ) -> None:
        dtype = dtype or config.torch_dtype
        hv, dk, dv = config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim
        self._allocate(
            config.layer_types, num_pages, dtype, device, snapshot_every,
            kv=(config.num_key_value_heads, PAGE_SIZE, config.head_dim), conv_dim=config.conv_dim,
            g=(hv,), beta=(hv,), state=(hv, dk, dv),
        )  # fmt: skip
        self.bytes_per_page = hybrid_bytes_per_page(config, dtype, snapshot_every)

    def _allocate(
        self,
        layer_types: list[str],
        num_pages: int,
        dtype: torch.dtype,
        device: torch.device | str,
        snapshot_every: int,
        *,
        kv: tuple[int, ...],
        conv_dim: int,
        g: tuple[int, ...],
        beta: tuple[int, ...],
        state: tuple[int, ...],
    ) -> None:
        """The tensors of every layer, in a family's shapes (per page: ``kv`` [heads, 64, dim] of a full-
        attention layer; per position: the conv input, ``g`` and ``beta``; per snapshot slot: ``state``)."""
        if num_pages < 1:
            raise ValueError(f"{type(self).__name__} needs at least one page, got {num_pages}")
        self.num_pages = num_pages
        self.device = torch.device(device)
        self.snapshot_every = snapshot_every
        self.slots = SnapshotSlots(num_pages, snapshot_slots(num_pages, snapshot_every))

        def zeros(*shape, dt=F32):
            return torch.zeros(shape, dtype=dt, device=device)

        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.conv_in: dict[int, torch.Tensor] = {}
        self.dr_g: dict[int, torch.Tensor] = {}
        self.dr_beta: dict[int, torch.Tensor] = {}
        self.state: dict[int, torch.Tensor] = {}
        for i, kind in enumerate(layer_types):
            if kind == "full_attention":
                self.k[i], self.v[i] = zeros(num_pages, *kv, dt=dtype), zeros(num_pages, *kv, dt=dtype)
            else:
                self.conv_in[i] = zeros(num_pages, PAGE_SIZE, conv_dim, dt=dtype)
                self.dr_g[i] = zeros(num_pages, PAGE_SIZE, *g)
                self.dr_beta[i] = zeros(num_pages, PAGE_SIZE, *beta)
                self.state[i] = zeros(self.slots.num_slots, *state)

    @property
    def bytes_total(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers())

    def buffers(self) -> list[torch.Tensor]:
        """Every tensor of the cache (K/V, recurrent inputs, state snapshots)."""
        kinds = (self.k, self.v, self.conv_in, self.dr_g, self.dr_beta, self.state)
        return [t for bufs in kinds for t in bufs.values()]

    # what one forward reads and writes: the same page-table view as a plain K/V cache's
    view = KVCache.view
    window_release = KVCache.window_release

    @torch.no_grad()
    def copy_page(self, src: int, dst: int, num_positions: int = PAGE_SIZE) -> None:
        """Copy the first num_positions positions of page src into page dst, every layer, bit-exact (dst
        loses any snapshot it held: its chunk is another now; a forward resuming after it recomputes)."""
        n = num_positions
        for bufs in (self.k, self.v):
            for buf in bufs.values():
                buf[dst, :, :n].copy_(buf[src, :, :n])
        for bufs in (self.conv_in, self.dr_g, self.dr_beta):
            for buf in bufs.values():
                buf[dst, :n].copy_(buf[src, :n])
        self.slots.forget([dst])
