"""Screenshot observations and image-pixel coordinates: the rewrite on its own, then on a real desktop
(Xvfb in the local provider's sandbox), where the pointer must land on the scaled screen pixel and an
oracle episode must score with a screenshot as its observation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from rz_agents.envs.base import as_messages
from rz_agents.envs.osworld import LOCAL_TASKS
from rz_agents.envs.osworld.gym_env import OSWorldEnv
from rz_agents.envs.osworld.policies import OraclePolicy
from rz_agents.envs.osworld.screen_scale import (
    ScreenScale,
    check_image_size,
    scale_pyautogui_code,
    scale_tree_table,
)
from rz_agents.images import from_png, message_images, to_png

HALF = ScreenScale(1920, 1080, 960, 540)
THREE = ScreenScale(1920, 1080, 640, 360)


def test_literal_coordinates_are_folded_to_screen_pixels():
    assert scale_pyautogui_code("pyautogui.click(640, 360)", ScreenScale(1920, 1080, 1280, 720)) == (
        "pyautogui.click(960, 540)"
    )
    assert scale_pyautogui_code("pyautogui.click(x=10, y=-4, button='right')", HALF) == (
        "pyautogui.click(x=20, y=-8, button='right')"
    )
    assert scale_pyautogui_code("pyautogui.moveTo((100, 200))", THREE) == "pyautogui.moveTo((300, 600))"
    assert scale_pyautogui_code("pyautogui.dragTo(5, 6, duration=0.5)", HALF) == (
        "pyautogui.dragTo(10, 12, duration=0.5)"
    )
    # scroll(clicks, x, y): the clicks are not a coordinate
    assert scale_pyautogui_code("pyautogui.scroll(-3, 10, 20)", HALF) == "pyautogui.scroll(-3, 20, 40)"
    assert scale_pyautogui_code("pyautogui.moveRel(10, -10)", HALF) == "pyautogui.moveRel(20, -20)"


def test_calls_without_coordinates_and_the_identity_are_left_as_written():
    for code in ("pyautogui.click()", "pyautogui.scroll(5)", "pyautogui.typewrite('a b')  # c", "x = ("):
        assert scale_pyautogui_code(code, HALF) == code
    assert scale_pyautogui_code("pyautogui.click(1, 2)", ScreenScale(800, 600, 800, 600)) == (
        "pyautogui.click(1, 2)"
    )


def test_runtime_values_are_scaled_by_helpers_defined_ahead_of_the_code():
    code = scale_pyautogui_code("p = (10, 20)\npyautogui.click(p)\npyautogui.moveTo(x=q, y=None)", HALF)
    assert code.startswith("def _rz_scale(") and "pyautogui.click(_rz_pair(p, 2.0, 2.0))" in code
    assert "pyautogui.moveTo(x=_rz_scale(q, 2.0), y=None)" in code


def test_tree_positions_and_sizes_move_to_image_pixels():
    table = "tag\tname\ttext\tclass\tdescription\tposition (top-left x&y)\tsize (w&h)\n"
    table += 'push-button\tOK\t""\t\t\t(100, 40)\t(60, 30)'
    assert scale_tree_table(table, HALF).splitlines()[1].endswith("(50, 20)\t(30, 15)")
    assert scale_tree_table(table, ScreenScale(10, 10, 10, 10)) == table


def test_bad_observation_and_image_size_are_refused_by_name():
    with pytest.raises(
        ValueError,
        match="observation must be one of a11y_tree, screenshot, screenshot_a11y_tree, got .pixels.",
    ):
        OSWorldEnv(observation="pixels")
    with pytest.raises(ValueError, match="set-of-marks"):
        OSWorldEnv(observation="som")
    with pytest.raises(ValueError, match="image_size=.*needs a screenshot observation"):
        OSWorldEnv(image_size=[640, 360])
    for bad in ([640], [640, 0], (640.0, 360), "640x360"):
        with pytest.raises(ValueError, match="image_size must be"):
            check_image_size(bad)


needs_desktop = pytest.mark.skipif(
    not (shutil.which("Xvfb") and shutil.which("openbox") and shutil.which("xdotool")),
    reason="needs xvfb, openbox and xdotool (scripts/install.sh installs them)",
)
FAST = {"accessibility": "fallback"}  # the tree is not what is under test


def _task(task_id: str) -> dict:
    return json.loads((Path(LOCAL_TASKS) / "os" / f"{task_id}.json").read_text())


def _pointer(env: OSWorldEnv) -> tuple[int, int]:
    out = env.desktop.ctx.client.execute(["xdotool", "getmouselocation", "--shell"])["output"]
    pos = dict(line.split("=") for line in out.split())
    return int(pos["X"]), int(pos["Y"])


@needs_desktop
def test_a_click_in_image_pixels_lands_on_the_scaled_screen_pixel():
    env = OSWorldEnv(observation="screenshot", image_size=[640, 360], pause=0.0, provider_options=FAST)
    try:
        messages, info = env.reset(options={"task": _task("rz-os-write-note")})
        assert info["screen_scale"] == {
            "screen_size": [1920, 1080],
            "image_size": [640, 360],
            "sx": 3.0,
            "sy": 3.0,
        }
        assert "(640x360 pixels, the pixels your coordinates refer to)" in messages[0]["content"]
        (image,) = message_images(messages)
        assert isinstance(image, Image.Image) and image.size == (640, 360) and image.mode == "RGB"
        assert messages[1]["content"][0]["text"].startswith("Given the screenshot as below.")
        obs, reward, terminated, truncated, _ = env.step("```python\npyautogui.click(101, 57)\n```")
        assert _pointer(env) == (303, 171) and (reward, terminated, truncated) == (0.0, False, False)
        (image,) = message_images(obs)
        assert image.size == (640, 360) and from_png(to_png(image)).tobytes() == image.tobytes()
        env.step("```python\np = (200, 100)\npyautogui.moveTo(p)\npyautogui.moveRel(-10, 5)\n```")
        assert _pointer(env) == (570, 315)  # (200, 100) * 3 + (-10, 5) * 3
        # a reply with no action: the error, and the screen all the same (a screenshot agent sees it always)
        obs, reward, terminated, truncated, info = env.step("let me think about it")
        assert (reward, terminated, truncated) == (0.0, False, False) and "action_error" in info
        assert obs[0]["content"][0]["text"].startswith("Your last action raised an error:\nAction error:")
        (image,) = message_images(obs)
        assert image.size == (640, 360)
    finally:
        env.close()


@needs_desktop
def test_an_oracle_episode_scores_with_screenshot_observations():
    oracle = OraclePolicy(Path(LOCAL_TASKS) / "oracles")
    for observation in ("screenshot", "screenshot_a11y_tree"):
        env = OSWorldEnv(observation=observation, image_size=[1280, 720], pause=0.0, provider_options=FAST)
        task = _task("rz-os-write-note")
        try:
            messages, _ = env.reset(options={"task": task})
            rewards, done = [], False
            while not done:
                reply = oracle(messages, task)
                messages.append({"role": "assistant", "content": reply})
                obs, reward, terminated, truncated, _ = env.step(reply)
                messages += as_messages(obs)
                rewards.append(reward)
                done = terminated or truncated
            images = message_images(messages)
            assert rewards[-1] == 1.0 and terminated, (observation, rewards)
            assert len(images) == len(rewards) and all(i.size == (1280, 720) for i in images)
            if observation == "screenshot_a11y_tree":
                assert "accessibility tree as below:\ntag\tname" in messages[1]["content"][0]["text"]
        finally:
            env.close()


def clicking_policy(messages, task):
    """A module:callable policy for the CLI test: checks it sees 320x180 screenshots, then solves the task."""
    images = message_images(messages)
    assert images and all(i.size == (320, 180) for i in images), [i.size for i in images]
    turn = sum(m["role"] == "assistant" for m in messages)
    if turn == 0:
        write = "open('/home/user/Desktop/notes.txt', 'w').write('buy milk\\n')"
        return f"```python\npyautogui.click(160, 90)\n{write}\n```"
    return "DONE"


@needs_desktop
def test_cli_eval_runs_screenshot_episodes_at_the_image_size(capsys):
    from osworld_cli_helper import rz_osworld

    task = Path(LOCAL_TASKS) / "os" / "rz-os-write-note.json"
    args = ["eval", "--tasks", str(task), "--policy", f"{__name__}:clicking_policy", "--json"]
    assert rz_osworld(*args, "--observation", "screenshot", "--image-size", "320", "180") == 0
    (row,) = json.loads(capsys.readouterr().out)["tasks"]
    assert (row["status"], row["score"], row["turns"]) == ("ok", 1.0, 2), row


def test_openai_messages_carry_screenshots_as_png_data_urls():
    import base64

    from rz_agents.eval.osworld_policies import openai_message

    img = Image.new("RGB", (8, 4), (10, 20, 30))
    msg = {"role": "user", "content": [{"type": "text", "text": "Given"}, {"type": "image", "image": img}]}
    out = openai_message(msg)
    assert out["content"][0] == {"type": "text", "text": "Given"}
    url = out["content"][1]["image_url"]["url"]
    assert out["content"][1]["type"] == "image_url" and url.startswith("data:image/png;base64,")
    assert from_png(base64.b64decode(url.split(",", 1)[1])).tobytes() == img.tobytes()
    assert openai_message({"role": "user", "content": "text"}) == {"role": "user", "content": "text"}
