"""A vision-language policy on OSWorld screenshots, end to end: configs/osworld-screenshot-vl.yaml's run on
real desktops (Xvfb in the local provider's sandbox), a tiny random-init Qwen3-VL sampled by the aligned
engine through the agent loop and trained by the learner. The trajectories carry one screenshot per
observation (PNG, rendered as <|vision_start|> + 8 <|image_pad|> + <|vision_end|>); each turn's request
repeats the earlier screenshots, which the engine serves from its cache instead of encoding them again;
every lag-0 token's learner log-prob equals the engine's exactly; the random policy's malformed replies fail
no episode and no step."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import torch

from rz_agents.cli.train import RunConfig
from rz_agents.config_io import load_config
from rz_agents.images import from_png
from rz_agents.runtime import LocalRun

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "osworld-screenshot-vl.yaml"

needs_desktop = pytest.mark.skipif(
    not (shutil.which("Xvfb") and shutil.which("openbox") and shutil.which("xdotool")),
    reason="needs xvfb, openbox and xdotool (scripts/install.sh installs them)",
)

# the file's run, one synchronous step: every trained token is lag 0 and every episode started is trained
ONE_STEP = ["steps=1", "mode=sync", "rollout.max_lag=0", "report=false"]


def test_the_config_file_is_valid():
    cfg = load_config(RunConfig, CONFIG)
    assert cfg.model.model_type == "qwen3_vl" and cfg.tokenizer == "byte" and cfg.model.kernels == "aligned"
    assert cfg.env.kwargs["observation"] == "screenshot" and cfg.env.kwargs["image_size"] == [128, 72]
    assert cfg.learner.assert_lag0_exact and cfg.runtime == "local"
    assert cfg.rollout.limits.max_episode_tokens < cfg.engine.max_len
    assert cfg.engine.max_running >= cfg.rollout.max_concurrent_episodes


@needs_desktop
def test_a_random_vlm_trains_on_screenshot_episodes_with_lag0_exact():
    run = LocalRun(load_config(RunConfig, CONFIG, ONE_STEP))
    template, trained = run.template, []
    inner = run.loop_runtime.learner_step

    async def learner_step(batch):
        trained.extend(batch)
        for t in batch:  # a random policy scores 0 everywhere: rewards that differ give the step a gradient
            t.reward = float(t.info["member"])
        return await inner(batch)

    run.loop_runtime.learner_step = learner_step
    tower = run.model.visual.patch_embed.proj.weight.detach().clone()
    try:
        summary = asyncio.run(run.train())
        stats = run.engine.stats()
    finally:
        run.close()
    assert summary["steps"] == 1 and summary["rollout"]["episodes_failed"] == 0
    assert len(trained) == 2 and summary["rollout"]["episodes_started"] == 2  # every episode is here
    requests = 0
    for t in trained:
        turns, finish = t.info["turns"], t.info["finish"]
        # one screenshot per observation: the reset's, then one after each turn the episode went on from
        assert len(t.images) in (turns, turns + 1), (turns, finish, len(t.images))
        # the template's image runs (a random policy may sample a vision token too: an ordinary token)
        context = [x for x, sampled in zip(t.tokens, t.loss_mask, strict=True) if not sampled]
        brackets = context.count(template.vision_start_id), context.count(template.vision_end_id)
        assert brackets == (len(t.images), len(t.images))
        assert context.count(template.image_token_id) == 8 * len(t.images)  # 128x64: 4x2 merged patches
        assert all(from_png(png).size == (128, 72) for png in t.images)
        if t.info["task_id"].startswith("rz-chrome"):  # the browser window, not a blank frame
            assert all(len(from_png(png).getcolors(maxcolors=1 << 16)) > 16 for png in t.images)
        requests += turns * (turns + 1) // 2  # turn k's request carries the k screenshots so far
    assert max(t.info["turns"] for t in trained) >= 2, [t.info for t in trained]
    # each screenshot was encoded once; the repeats in later turns' requests came from the prefix index (the
    # earlier turns' K/V: images_prefix_reused) or else from the engine's cache of encoded images
    distinct = {png for t in trained for png in t.images}
    reused = stats["images_reused"] + stats["images_prefix_reused"]
    assert stats["images_encoded"] + reused == requests
    assert stats["images_encoded"] <= len(distinct) and reused >= 1
    (step,) = run.history
    assert step["lag0_abs_dlogp_max"] == 0.0 and step["lag_max"] == 0
    assert step["lag0_token_count"] == sum(sum(t.loss_mask) for t in trained) > 0
    assert step["grad_norm"] > 0 and not torch.equal(run.model.visual.patch_embed.proj.weight, tower)
