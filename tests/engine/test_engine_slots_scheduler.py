"""Slot pool (allocation, prefix entries, memory) and scheduler (admission, batching) on their own."""

from __future__ import annotations

import random

import pytest

from rz_agents.engine.params import SamplingParams
from rz_agents.engine.scheduler import Scheduler
from rz_agents.engine.sequence import Sequence, SequenceStatus
from rz_agents.engine.slots import SlotPool, common_prefix_len


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


def test_slot_pool_hands_out_each_slot_once_then_refuses():
    pool = SlotPool(3, bytes_per_slot=100, prefix_cache=False)
    got = [pool.acquire([1, 2], version=0) for _ in range(3)]
    assert sorted(s for s, _ in got) == [0, 1, 2] and all(n == 0 for _, n in got)
    assert pool.acquire([1], 0) is None
    assert pool.bytes_held == 300 and pool.bytes_total == 300
    pool.release(1)
    assert pool.acquire([5], 0) == (1, 0)
    with pytest.raises(ValueError, match="not held"):
        pool.release(7)


def test_slot_pool_reuses_the_longest_matching_prefix_of_the_same_version():
    pool = SlotPool(3, bytes_per_slot=10)
    a, _ = pool.acquire([0], 0)
    b, _ = pool.acquire([0], 0)
    pool.release(a, [1, 2, 3, 4, 5], version=0)
    pool.release(b, [1, 2, 9], version=0)
    assert pool.num_prefix_entries == 2 and pool.bytes_prefix_cache == 20
    # The longest match wins; the last prompt token is always left to feed.
    assert pool.acquire([1, 2, 3, 4, 5], version=0) == (a, 4)
    assert pool.acquire([1, 2, 9, 9], version=1) == (2, 0)  # other version: the entry is not reused
    assert pool.prefix_hits == 1 and pool.prefix_tokens_reused == 4


def test_slot_pool_evicts_the_oldest_entry_when_full_and_drops_all_on_invalidate():
    pool = SlotPool(2, bytes_per_slot=1)
    s0, _ = pool.acquire([0], 0)
    s1, _ = pool.acquire([0], 0)
    pool.release(s0, [1, 1], 0)
    pool.release(s1, [2, 2], 0)
    assert pool.num_free == 2
    assert pool.acquire([7, 7], 0) == (s0, 0)  # no match: evicts the least recently stored
    assert pool.num_prefix_entries == 1
    pool.invalidate()
    assert pool.num_prefix_entries == 0 and pool.acquire([2, 2, 5], 0) == (s1, 0)


def test_slot_pool_entries_expire_after_ttl():
    now = [0.0]
    pool = SlotPool(1, bytes_per_slot=1, ttl_s=10.0, clock=lambda: now[0])
    s, _ = pool.acquire([0], 0)
    pool.release(s, [3, 4, 5], 0)
    now[0] = 11.0
    assert pool.acquire([3, 4, 5, 6], 0) == (s, 0)


def _seq(n_prompt: int) -> Sequence:
    return Sequence(list(range(1, n_prompt + 1)), SamplingParams())


def test_scheduler_queues_fifo_when_slots_run_out():
    sched = Scheduler(SlotPool(2, 1, prefix_cache=False), max_batch_tokens=100)
    seqs = [_seq(3) for _ in range(4)]
    for s in seqs:
        sched.add(s)
    sched.schedule(version=0)
    assert [s.status for s in seqs] == [SequenceStatus.RUNNING] * 2 + [SequenceStatus.WAITING] * 2
    sched.remove(seqs[1], keep_prefix=False, version=0)
    sched.schedule(version=0)
    assert seqs[2].status is SequenceStatus.RUNNING and seqs[3].status is SequenceStatus.WAITING


def test_scheduler_puts_decodes_first_then_chunks_prefills_within_the_budget():
    sched = Scheduler(SlotPool(4, 1, prefix_cache=False), max_batch_tokens=10, min_prefill_chunk=2)
    decoding = [_seq(5), _seq(5)]
    for s in decoding:
        sched.add(s)
    sched.schedule(0)
    for s in decoding:  # pretend their prompts are cached and one token was sampled
        s.num_cached = 5
        s.output.append(1)
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


def test_scheduler_keeps_prefill_moving_when_decodes_fill_the_budget():
    sched = Scheduler(SlotPool(8, 1, prefix_cache=False), max_batch_tokens=4, min_prefill_chunk=3)
    seqs = [_seq(2) for _ in range(6)]
    for s in seqs:
        sched.add(s)
    sched.schedule(0)
    for s in seqs[:5]:
        s.num_cached, s.output = 2, [1]
    batch = sched.schedule(0)
    assert sum(c.length for c in batch.chunks if c.seq is seqs[5]) == 2  # gets its chunk despite 5 decodes


def test_scheduler_on_weights_updated_recompute_forgets_kv_and_keep_marks_it():
    sched = Scheduler(SlotPool(2, 1), max_batch_tokens=100)
    a, b = _seq(4), _seq(4)
    sched.add(a)
    sched.add(b)
    sched.schedule(0)
    a.num_cached = b.num_cached = 4
    sched.on_weights_updated(recompute=False)
    assert a.num_cached == 4 and a.kv_from_old_weights
    sched.on_weights_updated(recompute=True)
    assert a.num_cached == 0 and not a.kv_from_old_weights
