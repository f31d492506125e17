"""Test helpers: a tiny Qwen3-VL policy with sharp logits and a batch of image episodes sampled from it by the
real rz engine (lag-0 tokens, PNG bytes on every trajectory), shared by the one-process and the sharded
vision-language learner tests."""

import asyncio

import numpy as np

from rz_agents.engine import EngineConfig, ImagePrompt, RZEngine, SamplingParams
from rz_agents.images import to_png
from rz_agents.model.qwen3_vl import Qwen3VLModel
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig
from rz_agents.model.vl_processor import png_image_inputs
from rz_agents.trajectory import Trajectory

IMG, START, END = 300, 302, 303


def tiny_vl_model(kernels: str = "aligned") -> Qwen3VLModel:
    """A tiny Qwen3-VL (vocabulary 320) with sharp logits (weights of std 0.1, seed 4)."""
    model = Qwen3VLModel(Qwen3VLConfig.tiny(vocab_size=320), kernels=kernels)
    model.reset_parameters(std=0.1, seed=4)
    return model


def sample_vl_batch(model, groups: int = 2, g: int = 2) -> list[Trajectory]:
    """`groups` prompts with one image each, `g` samples per prompt, sampled by the engine."""
    engine = RZEngine(model, EngineConfig(max_running=4, max_len=96, max_batch_tokens=12, num_threads=1))
    rng = np.random.default_rng(0)
    reqs = []
    for gi, (h, w) in enumerate([(48, 80), (64, 64)][:groups]):
        png = to_png(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        pixels, grids = png_image_inputs([png], model.vl_config.vision)
        prompt = [5 + gi, 6, START] + [IMG] * (int(grids.prod()) // 4) + [END, 9]
        for j in range(g):
            params = SamplingParams(max_tokens=5, seed=10 * gi + j)
            reqs.append((gi, prompt, ImagePrompt(pixels, grids), [png], params))

    async def go():
        return await asyncio.gather(*(engine.generate(p, sp, images=im) for _, p, im, _, sp in reqs))

    outs = asyncio.run(go())
    trajs = []
    for (gi, prompt, _, pngs, _), out in zip(reqs, outs, strict=True):
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
                images=pngs,
            )
        )
    return trajs
