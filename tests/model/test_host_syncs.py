"""Positions are read on the host once per forward, not once per layer: the RoPE range check runs once, on
the highest position the forward already knows (the engine passes it with its cache view)."""

import pytest
import torch

from rz_agents.model import ModelConfig, Transformer
from rz_kernels.rope import RopeTable


def _host_reads(monkeypatch, layers: int, **tiny) -> int:
    torch.manual_seed(0)
    model = Transformer(ModelConfig.tiny("qwen3", num_hidden_layers=layers, **tiny))
    model.reset_parameters(std=0.1, seed=0)
    tokens = torch.randint(0, 320, (12,))
    positions = torch.cat([torch.arange(7), torch.arange(5)])
    reads = []
    original = torch.Tensor.__int__
    monkeypatch.setattr(torch.Tensor, "__int__", lambda t: reads.append(1) or original(t))
    with torch.no_grad():
        model(tokens, positions)
    monkeypatch.setattr(torch.Tensor, "__int__", original)
    return len(reads)


def test_a_forward_reads_positions_on_the_host_a_fixed_number_of_times_whatever_the_depth(monkeypatch):
    # before: 2 more per layer (RoPE of q, k)
    assert _host_reads(monkeypatch, 1) == _host_reads(monkeypatch, 6)


def test_a_position_past_the_table_is_still_refused_once_with_the_same_message():
    model = Transformer(ModelConfig.tiny("qwen3", max_position_embeddings=16))
    with pytest.raises(ValueError, match="position 16 exceeds max_position_embeddings 16"):
        model(torch.zeros(17, dtype=torch.long), torch.arange(17))
    table = RopeTable(8, 10000.0, 16)
    view = table.prechecked()
    view.check_positions(torch.tensor([99]))  # checked already: no host read, no error
    assert view.cos is table.cos and not table._prechecked
    with pytest.raises(ValueError, match="position 99 exceeds"):
        table.check_positions(torch.tensor([99]))
