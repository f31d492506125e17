"""Qwen3.5-MoE (qwen3_5_moe) in the engine: every sampled token's log-prob equals the learner's packed forward
bit for bit (torch.equal) in fp32 and bf16 across batch sizes with prefill cut inside chunks, and one-token
cached forwards (as decode) route every token to the experts the learner's packed forward picks (the router
never flips); the standard op set in the engine differs (negative control)."""

from __future__ import annotations

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, generate_batch
from rz_agents.model.policy import PolicySpec, build_policy
from tests.engine.test_engine_qwen3_5_alignment import _assert_equal, _learner_logprobs, _params, _prompts

VOCAB = 96


def _model(dtype: str = "float32", kernels: str = "aligned"):
    """A tiny random Qwen3.5-MoE (8 experts, top 2, a shared expert) with sharp logits."""
    model = build_policy(PolicySpec(model_type="qwen3_5_moe", vocab_size=VOCAB, dtype=dtype, kernels=kernels))
    model.reset_parameters(std=0.3, seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(3)
    return model.eval()


def _record_routes(model):
    """Each MoE block's chosen experts, per call, appended to the returned dict (layer -> [tensor])."""
    routes: dict[int, list[torch.Tensor]] = {}
    for i, layer in enumerate(model.model.layers):

        def hook(module, args, out, i=i):
            x, batch = args
            _, experts = batch.ops.route(batch.ops.linear(x, module.gate.weight), module.top_k, True)
            routes.setdefault(i, []).append(experts)

        layer.mlp.register_forward_hook(hook)
    return routes


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("batch", [1, 3])
def test_engine_logprobs_equal_the_learner_and_the_router_never_flips(dtype, batch):
    model = _model(dtype)
    engine = RZEngine(model, EngineConfig(max_len=256, max_batch_tokens=37, num_threads=1))
    prompts = _prompts([65, 3, 130][:batch], seed=batch)
    outs = generate_batch(engine, prompts, _params(batch))
    _assert_equal(model, prompts, outs)
    # the last three sampled positions: one-token cached forwards (as decode) and the learner's packed
    # forward pick the same experts in every layer
    routes = _record_routes(model)
    seq = prompts[0] + outs[0].tokens
    with torch.no_grad():
        model(torch.tensor(seq), seq_lens=[len(seq)])  # the learner's
        learner = {i: r[-1] for i, r in routes.items()}
        from rz_agents.model.qwen3_5 import SequenceState

        state = SequenceState()
        model(torch.tensor(seq[:-3]), seq_lens=[len(seq) - 3], states=[state])
        for t in range(len(seq) - 3, len(seq)):  # three one-token steps, as decode
            model(torch.tensor(seq[t : t + 1]), seq_lens=[1], states=[state])
    for i in learner:
        stepped = torch.cat([r for r in routes[i][-3:]])
        assert torch.equal(stepped, learner[i][-3:]), i


def test_negative_control_the_standard_op_set_in_the_engine_differs():
    model = _model()
    engine = RZEngine(
        _model(kernels="standard"), EngineConfig(max_len=256, max_batch_tokens=37, num_threads=1)
    )
    prompts = _prompts([65, 130], seed=3)
    outs = generate_batch(engine, prompts, _params(2))
    learner = _learner_logprobs(model, prompts, outs)
    assert any(not torch.equal(o.logprobs, lp) for o, lp in zip(outs, learner, strict=True))
