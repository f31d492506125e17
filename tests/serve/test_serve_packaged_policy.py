"""`rz serve NAME` for a packaged policy shaped like a run (``config.yaml`` naming its tokenizer and shape,
beside ``final_model/``): the name resolves to its checkpoint and is served with the config's tokenizer and
template, as a run directory is (the form scripts/train_tool_policy.py writes, since a byte-tokenizer
checkpoint has no tokenizer.json of its own)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from rz_agents.cli.serve import build_server
from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.checkpoint import save_hf_checkpoint
from rz_agents.model.packaged import PACKAGED_MODELS

SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=1024)  # fmt: skip
_DIRS: dict[str, Path] = {}


def checkpoint_dir() -> Path:
    """The packaged entry's ``module:function`` target (PACKAGED_MODELS' contract)."""
    return _DIRS["final_model"]


@pytest.fixture
def packaged_run_policy(tmp_path, monkeypatch):
    """A packaged name whose directory is a run's final_model (byte tokenizer, named by config.yaml)."""
    config = {"tokenizer": "byte", "num_threads": 1, "engine": {"max_len": 768, "max_running": 8},
              "model": {"model_type": "qwen3", "kernels": "aligned", "dtype": "float32",
                        "tiny_overrides": SHAPE}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    model = Transformer(ModelConfig.tiny("qwen3", **SHAPE), kernels="aligned")
    model.reset_parameters(std=0.05, seed=3)
    save_hf_checkpoint(model, tmp_path / "final_model")
    _DIRS["final_model"] = tmp_path / "final_model"
    monkeypatch.setitem(sys.modules, "packaged_policy_under_test", sys.modules[__name__])
    monkeypatch.setitem(PACKAGED_MODELS, "run-shaped-policy", "packaged_policy_under_test:checkpoint_dir")
    return model


def test_a_packaged_run_shaped_policy_is_served_by_name_with_its_configs_tokenizer(packaged_run_policy):
    import torch

    server, engine = build_server("run-shaped-policy", max_running=4)
    assert server.model_name == "run-shaped-policy"
    assert type(server.template).__name__ == "ByteChatTemplate"
    assert engine.config.max_len == 768 and engine.config.max_running == 4  # the config's, then the flag
    served = engine.model.state_dict()
    assert all(torch.equal(served[k], v) for k, v in packaged_run_policy.state_dict().items())


def test_a_packaged_name_keeps_an_explicit_model_name(packaged_run_policy):
    server, _ = build_server("run-shaped-policy", model_name="policy")
    assert server.model_name == "policy"
