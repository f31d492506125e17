"""The engine's paged cache of DeepSeek-V4: every per-sequence state its attention keeps between forwards
(the sliding window's K=V, the compressors' pending projections, the compressed entries and the indexer's
keys) lives in the sequence's pages, one page = 64 positions as for plain K/V.

Per page, for each layer (`key` names are the ones `deepseek_v4_attention.Layout` keeps in a
``SequenceState``):
- per position (64 rows): the attention's K=V (`{layer}.kv`, head_dim) and, on compressed layers, the
  compressor's kv / gate projections (`{layer}.compressor.kv|gate`, 2 x head_dim on CSA for its overlapping
  windows, head_dim on HCA) and on CSA layers the indexer compressor's (`{layer}.indexer.kv|gate`);
- per page, the compressed entries whose window ENDS in the page (`{layer}.compressor.entries`,
  `{layer}.indexer.entries`): 64 / m slots for a rate m that divides 64 (CSA m=4: 16), one slot for a rate
  that 64 divides (HCA m'=128: only every second page's slot is used, its window spans two pages).

Why this layout keeps prefix reuse exact: an entry is stored in the page of its window's last token, and every
row of a page is a function of the tokens up to that page's end (CSA's overlap reads the window before, which
is earlier still), so a page's whole content is named by the hash chain over its tokens and the page pool can
share it by reference; a partial page copy of n positions copies the first n rows and exactly the entries
whose windows end before n (``copy_page``). A rate that neither divides 64 nor is a multiple of it would put
two windows' ends in one slot and is refused by the constructor.

A forward reads each sequence's state back into the standalone ``SequenceState`` the model already runs
(``paged_forward``: rows from the first position a later token can read, `Reach.first_needed`, and every
entry so far), runs it, and writes the call's new rows and newly completed entries to the pages. The model's
arithmetic is the standalone path's (bit-equal to the learner's packed forward); only where the state lives
changes, so chunked prefill, preemption (recompute), prefix reuse and weight updates (keep or recompute) all
go through the page pool unchanged. A decode step (one token per row, ``decode_positions``) reads and writes
the same pages in place instead, in shapes fixed by (batch, position bound), so a CUDA graph can capture it
(model/deepseek_v4_decode.py; static buffers' padding rows write the scratch page).

Pages behind the window (``window_release``, engine/window_release.py): once every later call of a sequence
starts at or after position p, no call reads rows before ``Reach.first_needed(p)``, so a page wholly before it
keeps only its entries worth holding. The engine then copies those entries into an *archive page* and gives
the page back to the pool: an archive page is an ordinary page of the pool whose storage is read as
``archive_span`` pages' entry slots side by side (``archive``: the same bytes viewed another way), so the
sequence holds one archive page per ``archive_span`` pages behind its window (V4-Flash bf16: 29) instead of
every page. The page table keeps the archive page's id in each of those columns; ``archived[page]`` (on the
device, so nothing reads back) says how a column's entries are read: from the archive at (page, column mod
span, slot), or from the page itself. Writing rows to a page marks it an ordinary page again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rz_agents.model.deepseek_v4_attention import Reach, SequenceState
from rz_agents.model.deepseek_v4_config import DeepseekV4Config
from rz_agents.model.kv_cache import PAGE_SIZE, CacheView, KVCache


@dataclass(frozen=True)
class EntrySpec:
    """A compressed-entry store: `dim` channels per entry, one entry per `rate` positions."""

    dim: int
    rate: int

    @property
    def slots(self) -> int:
        """Entry slots per page: the windows that can end in one page."""
        return max(1, PAGE_SIZE // self.rate)


def row_specs(config: DeepseekV4Config) -> dict[str, int]:
    """The per-position state of every layer: key -> channels."""
    d, c = config.head_dim, config.index_head_dim
    out: dict[str, int] = {}
    for i, kind in enumerate(config.layer_types):
        out[f"{i}.kv"] = d
        if config.rate(i):
            width = 2 * d if kind == "compressed_sparse_attention" else d
            out[f"{i}.compressor.kv"] = out[f"{i}.compressor.gate"] = width
        if kind == "compressed_sparse_attention":
            out[f"{i}.indexer.kv"] = out[f"{i}.indexer.gate"] = 2 * c
    return out


def entry_specs(config: DeepseekV4Config) -> dict[str, EntrySpec]:
    """The compressed entries of every compressed layer: key -> (channels, rate)."""
    out: dict[str, EntrySpec] = {}
    for i, kind in enumerate(config.layer_types):
        if config.rate(i):
            out[f"{i}.compressor.entries"] = EntrySpec(config.head_dim, config.rate(i))
        if kind == "compressed_sparse_attention":
            out[f"{i}.indexer.entries"] = EntrySpec(config.index_head_dim, config.csa_rate)
    return out


def check_rates(config: DeepseekV4Config) -> None:
    """Refuse a compression rate whose windows' ends do not map to one slot of one page each."""
    for rate in {config.csa_rate, config.hca_rate}:
        if PAGE_SIZE % rate and rate % PAGE_SIZE:
            raise ValueError(
                f"DeepSeek-V4 engine cache: compression rate {rate} must divide the {PAGE_SIZE}-position "
                "page or be a multiple of it (a page stores the entries whose windows end in it)"
            )


def v4_bytes_per_page(config: DeepseekV4Config, dtype: torch.dtype | None = None) -> int:
    """Bytes one page (64 positions) holds over all layers: the per-position rows and the entry slots, and
    the byte saying whether it is an archive page."""
    item = torch.empty(0, dtype=dtype or config.torch_dtype).element_size()
    rows = sum(row_specs(config).values()) * PAGE_SIZE
    entries = sum(s.slots * s.dim for s in entry_specs(config).values())
    return (rows + entries) * item + 1


def archive_span(config: DeepseekV4Config) -> int:
    """How many pages' entry slots one page holds when read as an archive page (0: no entries)."""
    entries = sum(s.slots * s.dim for s in entry_specs(config).values())
    return (sum(row_specs(config).values()) * PAGE_SIZE + entries) // entries if entries else 0


def pages_held(config: DeepseekV4Config, positions: int, released: bool = True) -> int:
    """Pages a sequence of `positions` tokens holds in the engine at its end: every page, or (``released``,
    engine/window_release.py) the pages from the first one a later call reads, plus one archive page per
    `archive_span` pages given back."""
    total = -(-positions // PAGE_SIZE)
    span = archive_span(config)
    if not released or span < 2:
        return total
    reach = Reach(config.sliding_window, config.csa_rate, config.hca_rate)
    given = reach.first_needed(positions) // PAGE_SIZE  # (every page before it is full, so indexed)
    return total - given + -(-given // span)


class DeepseekV4Cache:
    """The pages of a DeepSeek-V4 engine cache (see the module docstring); ``view`` as ``KVCache``'s.
    ``rows[key]``: [num_pages, 64, channels]; ``entries[key]``: [num_pages, slots, channels];
    ``archive[key]``: [num_pages, archive_span, slots, channels]: views of one buffer ``storage``."""

    def __init__(
        self,
        config: DeepseekV4Config,
        num_pages: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_pages < 1:
            raise ValueError(f"DeepseekV4Cache needs at least one page, got {num_pages}")
        check_rates(config)
        self.num_pages = num_pages
        self.device = torch.device(device)
        dtype = dtype or config.torch_dtype
        self.reach = Reach(config.sliding_window, config.csa_rate, config.hca_rate)
        self.specs = entry_specs(config)
        widths = row_specs(config)
        entry_elems = sum(s.slots * s.dim for s in self.specs.values())
        page_elems = sum(widths.values()) * PAGE_SIZE + entry_elems
        # zeros: a masked slot multiplies a finite value by an exact 0 probability
        self.storage = torch.zeros(num_pages, page_elems, dtype=dtype, device=device)
        self.rows, offset = {}, 0
        for k, w in widths.items():
            self.rows[k] = self.storage[:, offset : offset + PAGE_SIZE * w].view(num_pages, PAGE_SIZE, w)
            offset += PAGE_SIZE * w
        self.entries, self._entry_at = {}, {}  # (_at: where in a page each key's slots start)
        for k, s in self.specs.items():
            size = s.slots * s.dim
            self.entries[k] = self.storage[:, offset : offset + size].view(num_pages, s.slots, s.dim)
            self._entry_at[k] = offset
            offset += size
        # the archive: a whole page read as archive_span pages' entries (V4-Flash: 1/29 of a page each)
        self.archive_span = archive_span(config)
        self.archive, self._archive_at, offset = {}, {}, 0
        for k, s in self.specs.items():
            size = self.archive_span * s.slots * s.dim
            self.archive[k] = self.storage[:, offset : offset + size].view(
                num_pages, self.archive_span, s.slots, s.dim
            )
            self._archive_at[k] = offset
            offset += size
        self.archived = torch.zeros(num_pages, dtype=torch.bool, device=device)  # see the module docstring
        self.bytes_per_page = v4_bytes_per_page(config, dtype)

    @property
    def bytes_total(self) -> int:
        return self.num_pages * self.bytes_per_page

    def buffers(self) -> list[torch.Tensor]:
        """Every tensor of the cache."""
        return [self.storage, self.archived]

    view = KVCache.view

    def read_entries(
        self, key: str, page: torch.Tensor, column: torch.Tensor, slot: torch.Tensor
    ) -> torch.Tensor:
        """Entries [..., channels] of `key` at (page, page-table column, slot) (index tensors of one shape):
        an archive page's (``archived[page]``: its part ``column % archive_span``) or the page's own slot.
        Each entry is read once: its start in the storage is picked on the device, then one gather from an
        overlapping row view of the storage (row i: the `channels` elements from element i on)."""
        dim = self.specs[key].dim
        base = page * self.storage.shape[1]
        at = base + self._entry_at[key] + slot * dim
        if self.archive_span:
            part = column % self.archive_span * self.specs[key].slots + slot
            at = torch.where(self.archived[page], base + self._archive_at[key] + part * dim, at)
        flat = self.storage.view(-1)
        return flat.as_strided((flat.numel() - dim + 1, dim), (1, 1))[at]

    def window_release(self) -> DeepseekV4Cache | None:
        """This cache, whose pages behind the sliding window the engine may give back (``pages_behind``,
        ``archive_page``); None when an archive page would hold no more than one page's entries (no gain)."""
        return self if self.archive_span >= 2 else None

    def pages_behind(self, position: int) -> int:
        """Leading pages of a sequence whose rows no call starting at or after ``position`` reads."""
        return self.reach.first_needed(position) // PAGE_SIZE

    @torch.no_grad()
    def archive_page(self, src: int, dst: int, index: int) -> None:
        """Copy page src's entry slots into archive page dst as its ``index``-th page (src's rows are behind
        every later call's reach; dst becomes, or already is, an archive page)."""
        for key, buf in self.entries.items():
            self.archive[key][dst, index].copy_(buf[src])
        self.archived[dst] = True

    @torch.no_grad()
    def copy_page(self, src: int, dst: int, num_positions: int = PAGE_SIZE) -> None:
        """Copy the first num_positions rows of page src into page dst, every layer, and the entries whose
        windows end within them (bit-exact). src is an ordinary page (no prefix index holds an archive
        page)."""
        n = num_positions
        for buf in self.rows.values():
            buf[dst, :n].copy_(buf[src, :n])
        for key, buf in self.entries.items():
            rate = self.specs[key].rate
            done = n // rate if rate <= PAGE_SIZE else int(n == PAGE_SIZE)
            buf[dst, :done].copy_(buf[src, :done])
        self.archived[dst] = False


def _entry_address(table: torch.Tensor, row: int, first: int, end: int, rate: int) -> tuple:
    """(page, page-table column, slot) [n] of entries first..end-1 of the sequence in table row `row`."""
    w = torch.arange(first, end, device=table.device)
    column = torch.div((w + 1) * rate - 1, PAGE_SIZE, rounding_mode="floor")
    slot = (w * rate % PAGE_SIZE) // rate if rate <= PAGE_SIZE else torch.zeros_like(w)
    return table[row, column], column, slot


def _read_entries(cache: DeepseekV4Cache, table: torch.Tensor, row: int, key: str, done: int) -> torch.Tensor:
    """Entries 0..done-1 of `key` of table row `row`: from an archive page where the column's page is one,
    else from the page itself (picked on the device: no read-back)."""
    return cache.read_entries(key, *_entry_address(table, row, 0, done, cache.specs[key].rate))


def _row_address(table: torch.Tensor, row: int, first: int, end: int) -> tuple:
    """(page, offset) [n] of positions first..end-1 of the sequence in table row `row`."""
    pos = torch.arange(first, end, device=table.device)
    return table[row, torch.div(pos, PAGE_SIZE, rounding_mode="floor")], pos % PAGE_SIZE


def _host_runs(positions: torch.Tensor, seq_ids: torch.Tensor, view: CacheView) -> tuple[list, list]:
    """Each table row's first position in this call and its token count (read back from the device)."""
    rows = view.page_table.shape[0]
    ids, pos = seq_ids.cpu(), positions.cpu()
    counts = torch.bincount(ids, minlength=rows)
    starts = torch.full((rows,), 0, dtype=torch.long).scatter_reduce(0, ids, pos, "amin", include_self=False)
    return starts.tolist(), counts.tolist()


def read_states(cache: DeepseekV4Cache, view: CacheView, starts: Sequence[int]) -> list[SequenceState]:
    """Each table row's ``SequenceState`` entering a call at position starts[row]: the rows from the first
    position a token there can read, and every entry pooled so far (``keep_all``: the call keeps every
    row it feeds, the pages take them all)."""
    table = view.page_table
    states = []
    for r, p in enumerate(starts):
        first = cache.reach.first_needed(p)
        st = SequenceState(position=p, start=first, keep_all=True)
        page, off = _row_address(table, r, first, p)
        st.rows = {k: buf[page, off] for k, buf in cache.rows.items()}
        for key in cache.entries:
            done = p // cache.specs[key].rate
            if done:
                st.entries[key] = _read_entries(cache, table, r, key, done)
        states.append(st)
    return states


@torch.no_grad()
def write_states(
    cache: DeepseekV4Cache, view: CacheView, starts: Sequence[int], states: Sequence[SequenceState]
) -> None:
    """Write what a call added to each row's state (its tokens' rows, its newly completed entries) to the
    row's pages."""
    table = view.page_table
    for r, (p, st) in enumerate(zip(starts, states, strict=True)):
        page, off = _row_address(table, r, p, st.position)
        cache.archived[page] = False  # a page whose rows are written is an ordinary page (again)
        for key, buf in cache.rows.items():
            buf[page, off] = st.rows[key][p - st.start :]
        for key, buf in cache.entries.items():
            rate = cache.specs[key].rate
            done, total = p // rate, st.position // rate
            if total > done:
                at, _, slot = _entry_address(table, r, done, total, rate)
                buf[at, slot] = st.entries[key][done:total]


def paged_forward(
    model, tokens: torch.Tensor, positions: torch.Tensor, seq_ids: torch.Tensor, view: CacheView
):
    """A DeepSeek-V4 forward over the engine's pages: each table row's state read from its pages, the
    model's standalone cached forward (``states``), the new state written back. Final hidden states [T, h]."""
    if not isinstance(view.cache, DeepseekV4Cache):
        raise TypeError(
            f"kv_cache must view a DeepseekV4Cache (new_kv_cache), got {type(view.cache).__name__}"
        )
    tokens, positions, seq_ids = tokens.reshape(-1), positions.reshape(-1), seq_ids.reshape(-1)
    if view.decode_positions is not None:  # token i is row i's one token: the fixed-shape step over the pages
        bound = view.max_position if view.max_position is not None else max(view.decode_positions)
        if bound >= view.capacity:
            raise ValueError(f"position {bound} is past the page table's {view.capacity} positions")
        return model.paged_decode(tokens, positions, view.cache, view.page_table, bound)
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        # a general call's shapes follow its host positions: only the decode step is captured
        raise RuntimeError(
            "a DeepSeek-V4 cached forward is captured in a CUDA graph only as a decode step "
            "(decode_positions)"
        )
    starts, counts = _host_runs(positions, seq_ids, view)
    top = max(a + n for a, n in zip(starts, counts, strict=True)) - 1
    if top >= view.capacity:
        raise ValueError(f"position {top} is past the page table's {view.capacity} positions")
    states = read_states(view.cache, view, starts)
    hidden = model(tokens, positions, seq_ids, states=states)
    write_states(view.cache, view, starts, states)
    return hidden
