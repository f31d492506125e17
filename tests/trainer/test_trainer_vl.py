"""The learner on a vision-language model (Qwen3-VL): trajectories sampled by the rz engine from requests with
images carry those images; the learner re-encodes them in its packed forward and every lag-0 token's log-prob
equals the engine's behavior log-prob exactly (assert_lag0_exact), and the step updates the vision tower
too. Negative control: on the standard op set the same step measures a non-zero lag-0 |dlogp|."""

import asyncio

import torch

from rz_agents.engine import EngineConfig, ImagePrompt, RZEngine, SamplingParams
from rz_agents.model.qwen3_vl import Qwen3VLModel
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig
from rz_agents.trainer.learner import Learner, LearnerConfig
from rz_agents.trainer.optim import OptimConfig
from rz_agents.trajectory import Trajectory

IMG, START, END = 300, 302, 303


def _model(kernels: str = "aligned") -> Qwen3VLModel:
    model = Qwen3VLModel(Qwen3VLConfig.tiny(vocab_size=320), kernels=kernels)
    model.reset_parameters(std=0.1, seed=4)
    return model


def _episodes(model, groups: int = 2, g: int = 2) -> list[Trajectory]:
    """`groups` prompts with one image each, `g` samples per prompt, sampled by the engine."""
    engine = RZEngine(model, EngineConfig(max_running=4, max_len=96, max_batch_tokens=12, num_threads=1))
    gen = torch.Generator().manual_seed(0)
    reqs = []
    for gi, grid in enumerate([(1, 4, 6), (1, 2, 4)][:groups]):
        prompt = [5 + gi, 6, START] + [IMG] * (grid[1] * grid[2] // 4) + [END, 9]
        pixels = torch.randn(grid[1] * grid[2], 3 * 2 * 8 * 8, generator=gen)
        for j in range(g):
            reqs.append(
                (gi, prompt, ImagePrompt(pixels, [grid]), SamplingParams(max_tokens=5, seed=10 * gi + j))
            )

    async def go():
        return await asyncio.gather(*(engine.generate(p, sp, images=im) for _, p, im, sp in reqs))

    outs = asyncio.run(go())
    trajs = []
    for (gi, prompt, images, _), out in zip(reqs, outs, strict=True):
        n = len(out.tokens)
        reward = float(sum(t % 2 == 0 for t in out.tokens))
        trajs.append(
            Trajectory(
                prompt + out.tokens,
                [False] * len(prompt) + [True] * n,
                [0.0] * len(prompt) + out.logprobs.tolist(),
                [-1] * len(prompt) + out.versions,
                reward,
                gi,
                images=images,
            )
        )
    return trajs


def _cfg(exact: bool) -> LearnerConfig:
    return LearnerConfig(optim=OptimConfig(lr=1e-2, max_grad_norm=1.0), assert_lag0_exact=exact)


def test_learner_lag0_exact_with_images_and_the_tower_trains():
    model = _model()
    trajs = _episodes(model)
    assert len({t.reward for t in trajs}) > 1  # a non-zero advantage somewhere: the step has a gradient
    before = model.visual.patch_embed.proj.weight.detach().clone()
    metrics = Learner(model, _cfg(exact=True)).step(trajs)
    assert metrics["lag0_abs_dlogp_max"] == 0.0 and metrics["step_skipped_nonfinite"] == 0
    assert not torch.equal(model.visual.patch_embed.proj.weight, before)


def test_negative_control_standard_kernels_measure_a_mismatch():
    model = _model(kernels="standard")
    trajs = _episodes(model)
    metrics = Learner(model, _cfg(exact=False)).step(trajs)
    assert 0.0 < metrics["lag0_abs_dlogp_max"] < 1e-3
