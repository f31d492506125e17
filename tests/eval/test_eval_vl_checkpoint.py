"""The evaluation's checkpoint policy shows a vision-language (Qwen3-VL) checkpoint its screenshots exactly as
training's rollouts do (`rz eval osworld --checkpoint` / `rz osworld eval`, and `rz eval RUN/config.yaml` on a
visual env): the template training gives the policy renders each screenshot as its image run, and the engine
receives the image, preprocessed as the checkpoint's preprocessor_config.json says. A saved screenshot
(docs/img/inspector.png) resized as the OSWorld env resizes it stands in for the desktop. A text-only
checkpoint asked to see screenshots is refused by name; a VL checkpoint on the tree alone sees text only."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
import torch

from rz_agents.cli import main
from rz_agents.engine import EngineConfig, RZEngine, SamplingParams
from rz_agents.envs.osworld import LOCAL_TASKS
from rz_agents.envs.osworld.a11y import TRUNCATED
from rz_agents.envs.osworld.prompts import observation_prompt, system_prompt
from rz_agents.envs.osworld.screen_scale import resize_screenshot
from rz_agents.eval.checkpoint_policy import load_checkpoint_policy
from rz_agents.eval.osworld_policies import EnginePolicy, PolicyError, Sampling, model_policy
from rz_agents.images import image_part, text_part, to_png
from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.checkpoint import save_hf_checkpoint
from rz_agents.model.qwen3_vl import Qwen3VLModel
from rz_agents.model.qwen3_vl_config import ImageProcessing
from rz_agents.model.vl_processor import png_image_inputs, preprocess_images
from rz_agents.rollout.agent_loop import EpisodeLimits, EpisodeSpec, run_episode
from rz_agents.runtime.factories import build_tokenizer, policy_template, tiny_vl_config

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "img" / "inspector.png"  # a real UI screenshot, 1200x760
IMAGE_SIZE = (128, 72)  # configs/osworld-screenshot-vl.yaml's
RENAME = str(Path(LOCAL_TASKS) / "os" / "rz-os-rename-file.json")
VISION = {"patch_size": 16, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "depth": 2,
          "deepstack_visual_indexes": [0]}  # fmt: skip
TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 4096}  # fmt: skip
# Not the processor defaults: the 128x72 screenshot is enlarged to >= 32768 px (40 image tokens where the
# defaults give 8), so the pad count shows whose preprocessing the eval used.
PROCESSING = ImageProcessing(32768, 1 << 20, [0.5] * 3, [0.5] * 3)


def _vl_checkpoint(root: Path, vocab_size: int) -> str:
    config = tiny_vl_config({"vocab_size": vocab_size, **TEXT, "vision": VISION})
    vision = dataclasses.replace(config.vision, image_processing=PROCESSING)
    config = dataclasses.replace(config, vision=vision)
    torch.manual_seed(0)
    model = Qwen3VLModel(config)
    model.reset_parameters(seed=0)
    return str(save_hf_checkpoint(model, root / "vl"))


@pytest.fixture(scope="module")
def vl_policies(tmp_path_factory):
    """Loaded tiny random-init Qwen3-VL checkpoints: tokenizer name -> CheckpointPolicy (the Qwen vocabulary
    with Qwen's vision ids, read as a checkpoint without tokenizer.json; and the byte vocabulary)."""
    qwen = _vl_checkpoint(tmp_path_factory.mktemp("qwen"), 151936)
    byte = _vl_checkpoint(tmp_path_factory.mktemp("byte"), 320)
    return {"qwen3": load_checkpoint_policy(qwen), "byte": load_checkpoint_policy(byte, tokenizer="byte"),
            "paths": {"qwen3": qwen, "byte": byte}}  # fmt: skip


@pytest.fixture(scope="module")
def text_checkpoint(tmp_path_factory) -> str:
    cfg = ModelConfig.tiny("qwen3", vocab_size=151936, **TEXT)
    model = Transformer(cfg)
    model.reset_parameters(std=0.05, seed=0)
    return str(save_hf_checkpoint(model, tmp_path_factory.mktemp("text") / "tiny-qwen3"))


def _screenshot(flip: bool = False):
    image, _ = resize_screenshot(SCREENSHOT.read_bytes(), IMAGE_SIZE)  # what OSWorldEnv shows the policy
    return image.transpose(0) if flip else image  # (0: left-right mirror)


def _chat(observation: str, image=None, tree: str = "") -> list[dict]:
    """OSWorld's first turn for ``observation``, as OSWorldEnv.reset builds it."""
    text = observation_prompt(tree if observation != "screenshot" else None, None, observation)
    user = [text_part(text), image_part(image)] if observation != "a11y_tree" else text
    system = system_prompt("pyautogui", "Rename the file draft.txt.", IMAGE_SIZE, observation)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _recording(policy: EnginePolicy) -> list[dict]:
    """Every request the policy's engine gets: its prompt, its images and the completion (the engine runs)."""
    calls: list[dict] = []
    generate = policy.engine.generate

    async def spy(prompt, params=None, **kwargs):
        completion = await generate(prompt, params, **kwargs)
        calls.append({"prompt": list(prompt), "images": kwargs.get("images"), "completion": completion})
        return completion

    policy.engine.generate = spy
    return calls


class _Replay:
    """An env that shows the saved observation and ends after one turn (the desktop's part, replayed)."""

    def __init__(self, messages: list[dict]) -> None:
        self.messages = messages

    def reset(self, seed=None, options=None):
        return self.messages, {"task_id": "saved"}

    def step(self, text):
        return [], 0.0, True, False, {}


@pytest.mark.parametrize("kind", ["qwen3", "byte"])
def test_a_vl_checkpoint_gets_the_screenshot_as_training_sends_it(vl_policies, kind):
    loaded = vl_policies[kind]
    vl = loaded.model.vl_config
    assert vl.vision.image_processing == PROCESSING  # read from the checkpoint's preprocessor_config.json
    policy = EnginePolicy(loaded, Sampling(max_tokens=4), num_threads=1)
    calls = _recording(policy)
    chat = _chat("screenshot", _screenshot())
    reply = policy(chat, {"id": "t"})
    assert policy.engine.stats()["images_encoded"] == 1  # the image cache's misses: the tower saw it
    (call,) = calls
    png = to_png(_screenshot())
    pixels, grids = png_image_inputs([png], vl.vision)
    assert torch.equal(call["images"].pixel_values, pixels)
    assert torch.equal(torch.as_tensor(call["images"].image_grid_thw), grids)
    pads = int(grids.prod()) // vl.vision.spatial_merge_size**2
    assert call["prompt"].count(vl.image_token_id) == pads == 40
    default = dataclasses.replace(vl.vision, image_processing=ImageProcessing())
    assert int(preprocess_images([_screenshot()], default)[1].prod()) // 4 == 8  # the defaults would differ
    assert reply.prompt_tokens == len(call["prompt"])

    # training's rollout of the same observation: the template the run gives its policy, the agent loop's
    # request; greedy, so the aligned engine samples the same tokens
    tokenizer, template = build_tokenizer(kind)
    template = policy_template(template, vl)
    engine = RZEngine(loaded.model, EngineConfig(max_running=1, max_len=4096, num_threads=1))
    traj = asyncio.run(
        run_episode(
            engine,
            _Replay(chat),
            template,
            tokenizer,
            EpisodeSpec(None, 0, 0, seed=0),
            SamplingParams(temperature=0.0),
            EpisodeLimits(1, 4, 4000),
        )
    )
    n = len(call["prompt"])
    assert traj.tokens[:n] == call["prompt"] and traj.images == [png]
    assert traj.tokens[n:] == call["completion"].tokens

    # negative control: the picture decides what the model computes (a blind policy's would be equal)
    policy(_chat("screenshot", _screenshot(flip=True)), {"id": "t"})
    assert policy.engine.stats()["images_encoded"] == 2
    assert calls[1]["prompt"] == calls[0]["prompt"]
    assert not torch.equal(calls[1]["completion"].logprobs, calls[0]["completion"].logprobs)


def test_the_tree_is_cut_to_fit_and_the_screenshot_stays(vl_policies):
    loaded = vl_policies["qwen3"]
    policy = EnginePolicy(loaded, Sampling(max_tokens=4, history_turns=3), max_len=900, num_threads=1)
    calls = _recording(policy)
    tree = "\n".join(f'push-button\tButton {i}\t""\t\t\t({i}, 5)\t(10, 10)' for i in range(400))
    chat = _chat("screenshot_a11y_tree", _screenshot(), tree)
    for turn in range(2):  # an earlier turn with its own (mirrored) screenshot: dropped first
        earlier = _chat("screenshot_a11y_tree", _screenshot(flip=True), tree)[1]
        chat[1:1] = [earlier, {"role": "assistant", "content": f"earlier reply {turn}"}]
    policy(chat, {"id": "t"})
    (call,) = calls
    assert len(call["prompt"]) <= 900 - 4
    text = loaded.tokenizer.decode(call["prompt"])
    assert TRUNCATED in text and "push-button" in text and "earlier reply" not in text
    assert call["prompt"].count(loaded.model.vl_config.image_token_id) == 40  # one screenshot: the current
    assert torch.equal(
        call["images"].pixel_values,
        png_image_inputs([to_png(_screenshot())], loaded.model.vl_config.vision)[0],
    )


def test_a_vl_checkpoint_on_the_tree_alone_sees_text_only(vl_policies):
    loaded = vl_policies["qwen3"]
    policy = EnginePolicy(loaded, Sampling(max_tokens=4), num_threads=1)
    calls = _recording(policy)
    chat = _chat("a11y_tree", tree='push-button\tOK\t""\t\t\t(5, 5)\t(10, 10)')
    policy(chat, {"id": "t"})
    (call,) = calls
    assert call["images"] is None and policy.engine.stats()["images_encoded"] == 0
    tokenizer, text_template = build_tokenizer("qwen3")
    assert call["prompt"] == text_template.encode_prompt(tokenizer, chat)  # the text template's own render
    assert loaded.model.vl_config.image_token_id not in call["prompt"]


def test_a_text_only_checkpoint_refuses_screenshots_by_name(text_checkpoint, capsys):
    for observation in ("screenshot", "screenshot_a11y_tree"):
        with pytest.raises(ValueError, match="text-only model .*--observation a11y_tree"):
            model_policy(None, text_checkpoint, Sampling(), observation=observation, num_threads=1)
    policy = model_policy(None, text_checkpoint, Sampling(max_tokens=2), num_threads=1)  # the tree: as before
    with pytest.raises(PolicyError, match="text-only model"):
        policy(_chat("screenshot", _screenshot()), {"id": "t"})
    argv = ["eval", "osworld", "--tasks", RENAME, "--checkpoint", text_checkpoint,
            "--observation", "screenshot"]  # fmt: skip
    assert main(argv) == 2  # refused before any desktop starts
    assert "is a text-only model" in capsys.readouterr().err


def test_rz_eval_on_visual_click_shows_a_qwen_vocabulary_vl_checkpoint_its_pictures(vl_policies, tmp_path):
    from rz_agents.cli.train import load_run_config
    from rz_agents.eval.env_eval import EnvEvalConfig, run_env_eval

    config = tmp_path / "config.yaml"
    config.write_text(
        "tokenizer: qwen3\nnum_threads: 1\nmodel: {model_type: qwen3_vl}\n"
        "env: {id: rz_agents/VisualClick-v0, kwargs: {image_size: 64, system_prompt: false}}\n"
        "engine: {max_running: 2, max_len: 256}\n"
        "rollout: {limits: {max_turns: 1, max_tokens_per_turn: 4, max_episode_tokens: 200}}\n"
    )
    loaded = vl_policies["qwen3"]
    engine = RZEngine(loaded.model, EngineConfig(max_running=2, max_len=256, num_threads=1))
    cfg = EnvEvalConfig(checkpoint=vl_policies["paths"]["qwen3"], num_tasks=2, k=1, num_threads=1)
    from rz_agents.runtime.config import TrainConfig
    from rz_agents.runtime.factories import run_env_factory

    run_cfg = load_run_config(str(config))
    plan = TrainConfig.validate(run_cfg)
    result = run_env_eval(run_cfg, cfg, loaded, plan, run_env_factory(run_cfg, plan), engine=engine)
    assert result["num_failed"] == 0, result["first_error"]
    assert engine.stats()["images_encoded"] == 2  # each task's picture reached the tower
