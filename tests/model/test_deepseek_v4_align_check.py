"""`rz align-check --arch deepseek_v4`: random tiny DeepSeek-V4 models through the cached path (the engine's
paged cache, random scattered pages holding stale data, chunked prefill and decode) and the training forwards;
aligned: bit-identical and 0 indexer / router flips; the standard op set differs."""

from __future__ import annotations

import argparse

import torch

from rz_agents.cli.align_check import add_parser
from rz_agents.model.alignment import AlignmentReport, check_random_models


def test_align_check_accepts_deepseek_v4_aligned_is_bit_identical_without_flips_standard_differs():
    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub)
    assert sub.choices["align-check"].parse_args(["--arch", "deepseek_v4"]).arch == ["deepseek_v4"]
    aligned, standard = check_random_models(
        archs=("deepseek_v4",), dtypes=("float32",), batch_sizes=(1, 3), max_len=70, threads=1
    )
    assert aligned.kernels == "aligned" and aligned.bit_identical and aligned.tokens_checked > 300
    assert set(aligned.selections_checked) == {"indexer", "router"}
    assert all(n > 100 for n in aligned.selections_checked.values())
    assert aligned.selection_flips == {"indexer": 0, "router": 0}
    assert standard.kernels == "standard" and standard.mismatched_tokens > 0
    assert not standard.bit_identical


def test_a_selection_flip_alone_fails_the_verdict():
    """Equal log-probs do not pass a check whose selections differ (a flip can leave the figure unchanged)."""
    report = AlignmentReport("deepseek_v4", "float32", "aligned", 1)
    report.compare("x", torch.zeros(3), torch.zeros(3))
    same = [("indexer", torch.tensor([[0, 1], [2, -1]]))]
    report.compare_selections(same, same)
    assert report.bit_identical and report.selections_checked == {"indexer": 2}
    report.compare_selections([("indexer", torch.tensor([[0, 1], [1, -1]]))], same)
    assert report.selection_flips == {"indexer": 1} and not report.bit_identical
