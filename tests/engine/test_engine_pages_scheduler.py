"""Page pool (free list, reference counts, the prefix index) and scheduler (admission, batching,
sharing, preemption) on their own, without a model."""

from __future__ import annotations

import random

import pytest

from rz_agents.engine.pages import PagePool, common_prefix_len
from rz_agents.engine.params import SamplingParams
from rz_agents.engine.scheduler import Scheduler
from rz_agents.engine.sequence import Sequence, SequenceStatus


def _naive_lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_common_prefix_len_matches_a_linear_scan():
    rng = random.Random(0)
    for _ in range(300):
        a = [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
        b = a[: rng.randrange(0, len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 10))]
        assert common_prefix_len(a, b) == _naive_lcp(a, b)


def test_page_pool_hands_out_each_page_once_and_refuses_without_taking_any():
    pool = PagePool(5, bytes_per_page=100, prefix_cache=False)
    a, b = pool.allocate(3), pool.allocate(2)
    assert sorted(a + b) == [0, 1, 2, 3, 4] and pool.num_free == 0
    assert pool.allocate(1) is None and pool.bytes_used == 500
    pool.unref(b)
    assert pool.allocate(3) is None and pool.num_free == 2  # all or nothing
    assert sorted(pool.allocate(2)) == sorted(b)
    with pytest.raises(ValueError, match="not held"):
        pool.unref([b[0], b[0]])


def test_a_shared_page_is_freed_when_its_last_holder_lets_go():
    pool = PagePool(2, bytes_per_page=1, prefix_cache=False)
    (p,) = pool.allocate(1)
    pool.ref([p])
    pool.ref([p])
    assert pool.refcount(p) == 3
    pool.unref([p])
    pool.unref([p])
    assert pool.num_free == 1
    pool.unref([p])
    assert pool.num_free == 2
    with pytest.raises(ValueError, match="free"):
        pool.ref([p])


def _finished(pool: PagePool, tokens: list[int], version: int = 0) -> Sequence:
    """A sequence that wrote the K/V of all of ``tokens`` and let go of its pages (kept in the cache)."""
    seq = Sequence(list(tokens), SamplingParams())
    seq.pages = pool.allocate(-(-len(tokens) // 64))
    seq.num_cached = len(tokens)
    pool.track(seq, version)
    pool.release(seq, keep=True)
    return seq


def test_the_prefix_index_matches_the_longest_cached_prefix_of_the_same_version():
    pool = PagePool(8, bytes_per_page=10)
    a = _finished(pool, list(range(100)))
    b = _finished(pool, [0, 1, 9])
    assert pool.num_cached_pages == 3 and pool.bytes_prefix_cache == 30 and pool.bytes_held == 0
    m = pool.match(list(range(100)), version=0, share_running=0)
    assert m.full == a.pages[:1] and (m.partial_page, m.partial) == (a.pages[1], 35)
    assert m.computed == 99  # the last token is always left to feed
    m = pool.match([0, 1, 9, 9], version=0, share_running=0)
    assert (m.partial_page, m.computed) == (b.pages[0], 3)  # the best of two children of the root
    assert pool.match([0, 1, 9, 9], version=1, share_running=0).computed == 0  # other weights: not reused
    m = pool.match(list(range(50)) + [7, 7], version=0, share_running=0)
    assert m.full == [] and (m.partial_page, m.computed) == (a.pages[0], 50)  # diverging: the common part


def test_a_full_page_is_found_through_the_hash_chain_of_its_parents():
    pool = PagePool(8, bytes_per_page=1)
    x = list(range(1000, 1064))
    a = _finished(pool, [1] * 64 + x + [5])
    _finished(pool, [2] * 64 + x + [6])  # the same 64 tokens after another first page: another chain
    m = pool.match([1] * 64 + x + [5, 5], 0, share_running=0)
    assert m.full == a.pages[:2] and m.computed == 129
    m = pool.match([3] * 64 + x + [5, 5], 0, share_running=0)
    assert m.computed == 0  # no first page matches, so neither does the second


def test_allocation_evicts_the_least_recently_cached_page_and_invalidate_drops_all():
    pool = PagePool(3, bytes_per_page=1)
    for tok in (1, 2, 3):
        _finished(pool, [tok] * 64)
    assert pool.num_free == 0 and pool.num_cached_pages == 3
    assert pool.allocate(1) is not None  # evicts the least recently cached page
    assert pool.match([1] * 65, 0, 0).computed == 0 and pool.match([2] * 65, 0, 0).computed == 64
    pool.invalidate()
    assert pool.num_cached_pages == 0 and pool.num_free == 2


def test_evicting_a_page_evicts_the_cached_pages_that_continue_it():
    pool = PagePool(3, bytes_per_page=1)
    _finished(pool, [1] * 64 + [2] * 10)  # two pages: the second continues the first
    pool.allocate(1)
    assert pool.num_cached_pages == 2 and pool.num_free == 0
    assert pool.allocate(1) is not None  # evicts the first page, and its continuation (unreachable) with it
    assert pool.num_cached_pages == 0 and pool.num_free == 1


def test_cached_pages_expire_after_ttl():
    now = [0.0]
    pool = PagePool(1, bytes_per_page=1, ttl_s=10.0, clock=lambda: now[0])
    _finished(pool, [3, 4, 5])
    now[0] = 11.0
    assert pool.match([3, 4, 5, 6], 0, 0).computed == 0 and pool.num_free == 1


def test_pages_a_running_sequence_writes_match_only_past_the_sharing_threshold():
    pool = PagePool(8, bytes_per_page=1, prefix_cache=False)
    runner = Sequence(list(range(1, 41)), SamplingParams())
    runner.pages = pool.allocate(1)
    pool.track(runner, 0)
    assert pool.match(list(range(1, 41)) + [9], 0, share_running=0).potential == 0  # sharing off
    m = pool.match(list(range(1, 41)) + [9], 0, share_running=16)
    assert m.running and m.potential == 40 and m.computed == 0  # not written yet: worth waiting for
    runner.num_cached = 40
    m = pool.match(list(range(1, 41)) + [9], 0, share_running=16)
    assert (m.partial_page, m.computed) == (runner.pages[0], 40)
    assert pool.match(list(range(1, 11)) + [9], 0, share_running=16).computed == 0  # below the threshold


def _seq(n_prompt: int, first: int = 1) -> Sequence:
    return Sequence(list(range(first, first + n_prompt)), SamplingParams())


def _copies():
    log = []
    return log, lambda src, dst, n: log.append((src, dst, n))


def _sched(num_pages: int, **kw) -> Scheduler:
    kw.setdefault("max_batch_tokens", 100)
    return Scheduler(PagePool(num_pages, 1, prefix_cache=kw.pop("prefix_cache", False)), **kw)


def test_scheduler_queues_fifo_when_pages_run_out():
    sched = _sched(4)
    seqs = [_seq(100) for _ in range(3)]  # 2 pages each
    for s in seqs:
        sched.add(s)
    sched.schedule(version=0)
    assert [s.status for s in seqs] == [SequenceStatus.RUNNING] * 2 + [SequenceStatus.WAITING]
    assert len(seqs[0].pages) == 2 and not set(seqs[0].pages) & set(seqs[1].pages)
    sched.remove(seqs[1], keep_prefix=False, version=0)
    sched.schedule(version=0)
    assert seqs[2].status is SequenceStatus.RUNNING


def test_scheduler_caps_running_sequences_at_max_running():
    sched = _sched(100, max_running=2)
    seqs = [_seq(3) for _ in range(3)]
    for s in seqs:
        sched.add(s)
    sched.schedule(0)
    assert [s.status for s in seqs] == [SequenceStatus.RUNNING] * 2 + [SequenceStatus.WAITING]


def test_scheduler_puts_decodes_first_then_chunks_prefills_within_the_budget():
    sched = _sched(16, max_batch_tokens=10, min_prefill_chunk=2)
    decoding = [_seq(5), _seq(5)]
    for s in decoding:
        sched.add(s)
    sched.schedule(0)
    for s in decoding:  # pretend their prompts are cached and one token was sampled
        s.num_cached = 5
        s.append(1, 0.0, 0)
    long_a, long_b = _seq(30), _seq(30)
    sched.add(long_a)
    sched.add(long_b)
    batch = sched.schedule(0)
    assert [(c.seq, c.start, c.length) for c in batch.chunks] == [
        (decoding[0], 5, 1),
        (decoding[1], 5, 1),
        (long_a, 0, 8),
    ]
    assert [c.samples for c in batch.chunks] == [True, True, False]
    assert batch.num_tokens == 10
    long_a.num_cached = 29
    batch = sched.schedule(0)
    tail = [c for c in batch.chunks if c.seq is long_a][0]
    assert tail.samples and tail.length == 1  # last prompt token: it yields the first sample


def test_scheduler_keeps_prefill_moving_and_never_exceeds_the_token_budget():
    sched = _sched(16, max_batch_tokens=4, min_prefill_chunk=3)
    seqs = [_seq(2) for _ in range(6)]
    for s in seqs:
        sched.add(s)
    sched.schedule(0)
    for s in seqs[:5]:
        s.num_cached = 2
        s.append(1, 0.0, 0)
    decoded = set()
    for _ in range(5):
        batch = sched.schedule(0)
        assert batch.num_tokens <= 4
        assert (
            sum(c.length for c in batch.chunks if c.seq is seqs[5]) == 2
        )  # gets its chunk despite 5 decodes
        decoded |= {c.seq for c in batch.chunks if c.seq is not seqs[5]}
    assert decoded == set(seqs[:5])  # the decodes take turns: none waits forever


def test_group_members_share_the_prompt_pages_by_reference_and_free_them_with_the_last():
    log, copy = _copies()
    sched = _sched(32, copy_page=copy, share_min_tokens=16)
    prompt = list(range(1, 151))  # 150 tokens: 2 full pages + 22 positions
    first = Sequence(list(prompt), SamplingParams())
    sched.add(first)
    sched.schedule(0)
    members = [Sequence(list(prompt), SamplingParams()) for _ in range(3)]
    for m in members:
        sched.add(m)
    sched.schedule(0)
    assert all(m.status is SequenceStatus.WAITING for m in members)  # the prompt is not cached yet
    first.num_cached = 150
    sched.schedule(0)
    assert all(m.num_cached == 149 and m.pages[:2] == first.pages[:2] for m in members)
    assert all(m.pages[2] != first.pages[2] for m in members)  # the partial page is copied
    assert log == [(first.pages[2], m.pages[2], 149 - 128) for m in members]
    assert sched.pages.refcount(first.pages[0]) == 4 and sched.shared_prefix_tokens == 3 * 149
    shared = first.pages[:2]
    for s in [first, *members[:2]]:
        sched.remove(s, keep_prefix=False, version=0)
    assert all(sched.pages.refcount(p) == 1 for p in shared)
    sched.remove(members[2], keep_prefix=False, version=0)
    assert sched.pages.num_free == 32


def test_a_finished_turn_keeps_its_pages_for_the_next_turn():
    log, copy = _copies()
    sched = _sched(8, copy_page=copy, prefix_cache=True)
    turn1 = _seq(70)
    sched.add(turn1)
    sched.schedule(0)
    turn1.num_cached = 70
    turn1.append(5, 0.0, 0)
    pages = list(turn1.pages)
    sched.remove(turn1, keep_prefix=True, version=0)
    turn2 = Sequence(turn1.tokens + [6, 7], SamplingParams())
    sched.add(turn2)
    sched.schedule(0)
    assert turn2.num_cached == 70 and turn2.num_cached_prompt_tokens == 70
    assert turn2.pages[0] == pages[0] and log == [(pages[1], turn2.pages[1], 6)]


def test_running_out_of_pages_preempts_the_newest_which_recomputes_when_readmitted():
    sched = _sched(4, max_batch_tokens=100)
    old, new = _seq(64), _seq(64)
    for s in (old, new):
        sched.add(s)
    sched.schedule(0)
    for s in (old, new):  # prompts cached, one token sampled: each needs a second page to decode
        s.num_cached = 64
        s.append(9, 0.0, 0)
    sched.pages.allocate(1)  # somebody else holds one page: only one is left
    batch = sched.schedule(0)
    assert [c.seq for c in batch.chunks] == [old] and len(old.pages) == 2
    assert new.status is SequenceStatus.WAITING and new.num_cached == 0 and not new.pages
    assert sched.waiting[0] is new and sched.preemptions == 1 and new.num_preemptions == 1
    sched.remove(old, keep_prefix=False, version=0)
    batch = sched.schedule(0)
    # Re-admitted: it prefills prompt + generated token again, into fresh pages.
    assert [(c.seq, c.start, c.length) for c in batch.chunks] == [(new, 0, 65)] and len(new.pages) == 2


def test_scheduler_on_weights_updated_recompute_requeues_and_keep_marks():
    sched = _sched(8, prefix_cache=True)
    a, b = _seq(4), _seq(4, first=50)
    sched.add(a)
    sched.add(b)
    sched.schedule(0)
    a.num_cached = b.num_cached = 4
    sched.on_weights_updated(recompute=False)
    assert a.num_cached == 4 and a.kv_from_old_weights
    sched.on_weights_updated(recompute=True)
    assert a.num_cached == 0 and not a.kv_from_old_weights and not a.pages
    assert list(sched.waiting) == [a, b] and sched.pages.num_free == 8 and sched.preemptions == 0
