"""DeepSeek-V4's static decode step (engine/decode_step.py over model/deepseek_v4_cache.py's pages) under the
host-read recorder (engine/host_reads.py), as tests/engine/test_engine_cuda_graphs.py does for Qwen3: the V4
model and its paged cache read nothing back from the device in a decode step (the pages are addressed by the
step's device positions and page tables: model/deepseek_v4_decode.py). What remains is the CPU op set's MoE,
which groups tokens by expert with bincount().tolist() (kernels/rz_kernels/moe.py, as for qwen3_moe in
test_engine_host_syncs.py). The step's shapes are fixed by (batch, position bound), so a CUDA graph captures
it: the replays emulated on CPU are tests/engine/test_engine_deepseek_v4_graph_decode.py."""

from __future__ import annotations

import torch

from rz_agents.engine.decode_step import DecodeStep
from rz_agents.engine.host_reads import HostReads
from tests.engine.test_engine_deepseek_v4_alignment import _model, _prompts

TABLES = [[0], [1, 2]]
LENGTHS = [9, 70]  # one row in its first page, one past a page boundary


def _decode_step_reads(model) -> tuple[list[tuple[str, str]], torch.Tensor]:
    """(host reads, hidden states) of one static decode step over 2 prefilled rows (a bucket of 4)."""
    pages = 4
    cache = model.new_kv_cache(pages + 1, "cpu")
    step = DecodeStep(model, cache, max_batch=8, width=4, scratch_page=pages)
    step.buckets = [4]  # two padding rows (token 0 at position 0 on the scratch page)
    prompts = _prompts(LENGTHS, seed=1)
    with torch.inference_mode():
        for prompt, table in zip(prompts, TABLES, strict=True):
            n = len(prompt) - 1
            view = cache.view(torch.tensor([table]), n - 1)
            model(torch.tensor(prompt[:-1]), torch.arange(n), torch.zeros(n, dtype=torch.long), kv_cache=view)
    positions = [len(p) - 1 for p in prompts]
    buf = step.fill([p[-1] for p in prompts], positions, TABLES)
    with HostReads() as rec, torch.inference_mode():
        hidden = step.forward(buf, max(positions), positions + [0] * (buf.batch - len(positions)))
    return rec.reads, hidden[: len(prompts)]


def test_the_v4_static_decode_step_reads_nothing_back_but_the_cpu_moe_grouping():
    model = _model("float32")
    reads, hidden = _decode_step_reads(model)
    assert reads, "the CPU MoE's grouping is expected (if it is gone, tighten this test to no read at all)"
    others = [(op, where) for op, where in reads if not where.startswith("moe.py:")]
    assert others == [], others
    # the same rows through the learner's packed forward: the read-free path computes the same bits
    prompts = _prompts(LENGTHS, seed=1)
    with torch.no_grad():
        for row, prompt in enumerate(prompts):
            n = len(prompt)
            full = model(torch.tensor(prompt), torch.arange(n), torch.zeros(n, dtype=torch.long))
            assert torch.equal(full[-1], hidden[row])
