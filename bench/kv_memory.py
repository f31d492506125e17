"""KV-cache memory: the paged cache vs a slot cache, on the engine's own page pool and scheduler.

Workload (seeded): --sequences concurrent sequences (default 256) in groups of --group (16) samples
of one prompt; group prompts of 64..1024 tokens and total lengths of 64..8192 tokens, both drawn
log-uniformly (short episodes are common, long ones rare, as in agent rollouts). No model runs:
the scheduler admits the sequences, lets group members share their prompt's pages once the first
member has it cached (full pages by reference, the partial page copied), and every sequence then
grows to its final length, taking a page each time it crosses 64 positions. Page accounting is
exact; the bytes per page are those of Qwen3-4B (36 layers, 8 KV heads, head_dim 128, bf16).

Reports:
- kv_bytes_over_tokens: bytes of the pages in use / bytes of the distinct positions they hold
  (a group's prompt counted once; goal <= 1.2: waste is only the last page of each sequence and
  the copied partial prompt page);
- kv_bytes_over_sequence_tokens: the same over every sequence's own length (sharing makes it < 1);
- paged_over_slot_capacity: sequences of this workload one fixed budget admits at once, paged vs
  a slot cache reserving max_len = 8192 positions per sequence (goal >= 4). The budget is
  --budget-slots slots of the slot cache (default 48, the issue's H200 figure at 16K would be 24).

  python bench/kv_memory.py --json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rz_agents.engine.pages import PagePool  # noqa: E402
from rz_agents.engine.params import SamplingParams  # noqa: E402
from rz_agents.engine.scheduler import Scheduler  # noqa: E402
from rz_agents.engine.sequence import Sequence, SequenceStatus  # noqa: E402
from rz_agents.model.kv_cache import PAGE_SIZE, pages_for  # noqa: E402

# Qwen3-4B: K and V, 36 layers x 8 KV heads x 128 dims, bf16
BYTES_PER_POSITION = 2 * 36 * 8 * 128 * 2
MAX_LEN = 8192


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def workload(num: int, group: int, seed: int) -> list[tuple[list[int], int]]:
    """(prompt tokens, final length) per sequence; members of a group share the prompt."""
    rng = random.Random(seed)
    out = []
    for g in range(-(-num // group)):
        prompt_len = log_uniform(rng, 64, 1024)
        prompt = [rng.randrange(1, 50_000) for _ in range(prompt_len)]
        for _ in range(min(group, num - g * group)):
            total = max(prompt_len + 1, log_uniform(rng, 64, MAX_LEN))
            out.append((prompt, min(total, MAX_LEN)))
    return out


def _sequences(work):
    seqs = [Sequence(list(prompt), SamplingParams()) for prompt, _ in work]
    for i, s in enumerate(seqs):
        s.seq_id = i
    return seqs


def run_to_length(sched: Scheduler, seqs: list[Sequence], finals: list[int], steps: int = 64) -> None:
    """Prefill every admitted sequence (sharing prompts), then grow each to its final length.

    Instead of one token per step, each step appends up to ``steps`` tokens per sequence (the
    pages a sequence needs depend only on its length, so the end state is the same).
    """
    for _ in range(10_000):
        batch = sched.schedule(version=0)
        if not batch.chunks:
            break
        for c in batch.chunks:
            c.seq.num_cached = c.start + c.length
        grew = False
        for s in sched.running:
            if s.num_cached == s.num_tokens and s.num_tokens < finals[s.seq_id]:
                for _ in range(min(steps, finals[s.seq_id] - s.num_tokens)):
                    s.append(60_000 + s.seq_id, 0.0, 0)
                s.num_cached = s.num_tokens - 1
                grew = True
        if not grew and all(s.num_cached == s.num_tokens for s in sched.running) and not sched.waiting:
            break


def distinct_positions(seqs: list[Sequence], work) -> int:
    """Positions held once: each group's prompt once, plus each sequence's own tokens after it."""
    seen: set[int] = set()
    total = 0
    for s, (prompt, _) in zip(seqs, work, strict=True):
        if id(prompt) not in seen:
            seen.add(id(prompt))
            total += len(prompt)
        total += s.num_tokens - len(prompt)
    return total


def measure(args) -> dict:
    work = workload(args.sequences, args.group, args.seed)
    finals = [n for _, n in work]
    # 1) memory use with every sequence resident at its final length (a pool big enough for all)
    pool = PagePool(args.sequences * pages_for(MAX_LEN), BYTES_PER_POSITION * PAGE_SIZE, prefix_cache=False)
    sched = Scheduler(pool, max_batch_tokens=1 << 20, copy_page=lambda *a: None, share_min_tokens=32)
    seqs = _sequences(work)
    for s in seqs:
        sched.add(s)
    run_to_length(sched, seqs, finals)
    assert all(
        s.status is SequenceStatus.RUNNING and s.num_tokens == f for s, f in zip(seqs, finals, strict=True)
    )
    used = pool.bytes_used
    distinct = distinct_positions(seqs, work) * BYTES_PER_POSITION
    own = sum(finals) * BYTES_PER_POSITION

    # 2) capacity: how many of these sequences one budget holds at once, each at its final length
    budget_pages = args.budget_slots * pages_for(MAX_LEN)
    pool2 = PagePool(budget_pages, BYTES_PER_POSITION * PAGE_SIZE, prefix_cache=False)
    sched2 = Scheduler(pool2, max_batch_tokens=1 << 20, copy_page=lambda *a: None, share_min_tokens=32)
    seqs2 = _sequences(work)
    for s in seqs2:  # admitted at full length, so no preemption: a lower bound on what fits
        for _ in range(finals[s.seq_id] - s.num_tokens):  # its own tokens: shared with nobody
            s.append(60_000 + s.seq_id, 0.0, 0)
        sched2.add(s)
    for _ in range(10_000):
        before = len(sched2.running)
        batch = sched2.schedule(version=0)
        for c in batch.chunks:
            c.seq.num_cached = c.start + c.length
        if len(sched2.running) == before and not batch.chunks:
            break
    paged = len(sched2.running)
    return {
        "sequences": args.sequences,
        "group": args.group,
        "mean_length": round(sum(finals) / len(finals), 1),
        "max_length": max(finals),
        "kv_bytes_used": used,
        "kv_bytes_of_distinct_tokens": distinct,
        "kv_bytes_over_tokens": round(used / distinct, 4),
        "kv_bytes_over_sequence_tokens": round(used / own, 4),
        "slot_cache_bytes_for_all": args.sequences * pages_for(MAX_LEN) * PAGE_SIZE * BYTES_PER_POSITION,
        "budget_gib": round(budget_pages * PAGE_SIZE * BYTES_PER_POSITION / 2**30, 2),
        "slot_capacity": args.budget_slots,
        "paged_capacity": paged,
        "paged_over_slot_capacity": round(paged / args.budget_slots, 3),
        "paged_capacity_is_lower_bound": paged == len(seqs2),  # the workload ran out first
        "goals": {"kv_bytes_over_tokens": "<= 1.2", "paged_over_slot_capacity": ">= 4"},
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sequences", type=int, default=256)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--budget-slots", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    result = measure(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return result


if __name__ == "__main__":
    main()
