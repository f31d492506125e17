"""Heap settings and RSS readings used by the runtime (glibc on Linux)."""

import numpy as np

from rz_agents.runtime.memory import limit_heap_growth, rss_bytes, trim_heap


def test_heap_limits_apply_and_rss_tracks_a_freed_buffer():
    assert limit_heap_growth() is True  # glibc here
    before = rss_bytes()
    assert before > 10 * 2**20
    block = np.ones(256 * 2**20 // 8)  # 256 MiB, touched
    assert rss_bytes() > before + 200 * 2**20
    del block
    trim_heap()
    assert rss_bytes() < before + 50 * 2**20
