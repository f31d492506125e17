"""rz_agents/VisualClick-v0: deterministic pictures, a held-out split, the reward, and the baselines:
the picture-reading oracle scores 1.0 and random clicks score the chance rate."""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import pytest
from PIL import Image

from rz_agents.envs.base import ChatMessages
from rz_agents.envs.visual_click import ENV_ID, VisualClickEnv
from rz_agents.envs.visual_click.policies import mean_reward, oracle_policy, random_policy
from rz_agents.envs.visual_click.render import make_layout, render
from rz_agents.images import message_images


def _picture(messages) -> np.ndarray:
    (image,) = message_images(messages)
    return np.asarray(image)


def test_registered_and_the_observation_is_an_image_then_the_instruction():
    env = gymnasium.make(ENV_ID)
    messages, info = env.reset(seed=3)
    assert isinstance(env.unwrapped, VisualClickEnv) and ChatMessages().contains(messages)
    assert [m["role"] for m in messages] == ["system", "user"] and "64x64 pixel picture" in messages[0][
        "content"
    ]
    image, text = messages[1]["content"]
    assert (
        image["type"] == "image" and image["image"].shape == (64, 64, 3) and image["image"].dtype == np.uint8
    )
    assert text["text"] == f"Click the {info['target'].color} button."
    assert info["task_id"].startswith("visual-click/train/") and 0 < info["chance"] < 0.2
    assert Image.fromarray(image["image"]).size == (64, 64)


def test_pictures_are_deterministic_by_seed_and_task_and_the_test_split_is_held_out():
    env = VisualClickEnv()
    a, info = env.reset(seed=11)
    b, _ = env.reset(seed=11)
    c, _ = env.reset(seed=12)
    assert np.array_equal(_picture(a), _picture(b)) and not np.array_equal(_picture(a), _picture(c))
    split, index = info["task_id"].split("/")[1:]
    by_id, _ = env.reset(options={"task": {"id": info["task_id"]}})
    by_index, _ = env.reset(options={"task": {"split": split, "index": int(index)}})
    assert np.array_equal(_picture(by_id), _picture(a)) and np.array_equal(_picture(by_index), _picture(a))
    # layouts are drawn from separate streams per split: no test picture is a train picture
    train = {render(make_layout("train", i)).tobytes() for i in range(300)}
    test = {render(make_layout("test", i)).tobytes() for i in range(300)}
    assert len(train) == len(test) == 300 and not train & test
    # a finite training set: indices below num_train_tasks; the test split ignores it
    small = VisualClickEnv(num_train_tasks=5)
    ids = {small.reset(seed=s)[1]["task_id"] for s in range(60)}
    assert ids == {f"visual-click/train/{i}" for i in range(5)}
    held_out = VisualClickEnv(num_train_tasks=5, split="test")
    assert len({held_out.reset(seed=s)[1]["task_id"] for s in range(20)}) == 20


def test_reward_is_one_exactly_on_the_named_button():
    env = VisualClickEnv(image_size=48, n_buttons=2)
    messages, info = env.reset(seed=5)
    target = info["target"]
    hits = 0
    for y in range(48):
        for x in range(48):
            env.reset(seed=5)
            hits += env.step(f"click({x}, {y})")[1]
    assert hits == target.area and math.isclose(info["chance"], target.area / 48**2)
    env.reset(seed=5)
    assert env.step(f"I think pyautogui.click(x={target.x0}, y={target.y1 - 1})")[1:3] == (1.0, True)
    env.reset(seed=5)
    assert env.step(f"click({target.x1}, {target.y0})")[1:4] == (0.0, False, True)  # one past the edge


def test_a_miss_or_no_click_says_so_and_the_episode_goes_on_within_its_turns():
    env = VisualClickEnv(max_turns=3)
    _, info = env.reset(seed=1)
    obs, reward, terminated, truncated, step_info = env.step("the red one")
    assert (
        obs == [{"role": "user", "content": "Answer with click(x, y)."}] and step_info["error"] == "no_click"
    )
    t = info["target"]
    obs, reward, terminated, truncated, _ = env.step(f"click({t.x1 + 0.5}, {t.y1 + 0.5})")
    assert obs[0]["content"].startswith("Missed:") and (reward, terminated, truncated) == (0.0, False, False)
    obs, reward, terminated, truncated, _ = env.step(f"click{t.centre}")
    assert (reward, terminated) == (1.0, True)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"name_by": "label"},
        {"image_size": 128, "n_buttons": 6, "name_by": "label"},
        {"n_buttons": 2, "arrangement": "columns"},
        {"n_buttons": 2, "arrangement": "columns", "target_color": "red"},
    ],
)
def test_the_oracle_reads_the_picture_and_scores_one_on_both_splits(kwargs):
    for split in ("train", "test"):
        assert mean_reward(oracle_policy, 60, seed=100, split=split, **kwargs)["reward"] == 1.0


def test_random_clicks_score_the_chance_rate():
    n = 1500
    got = mean_reward(random_policy(seed=7), n, seed=0, split="test")
    sigma = math.sqrt(got["chance"] * (1 - got["chance"]) / n)
    assert abs(got["reward"] - got["chance"]) < 4 * sigma, got
    assert 0.02 < got["chance"] < 0.1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"image_size": 16}, "image_size must be an int in"),
        ({"n_buttons": 9}, "n_buttons must be an int in"),
        ({"name_by": "shape"}, "name_by must be one of color, label"),
        ({"split": "dev"}, "split must be one of train, test"),
        ({"num_train_tasks": 0}, "num_train_tasks must be a positive int"),
        ({"arrangement": "grid"}, "arrangement must be one of random, columns"),
        ({"target_color": "black"}, "target_color must be one of red, green"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VisualClickEnv(**kwargs)


def test_bad_tasks_are_refused_by_name():
    env = VisualClickEnv()
    with pytest.raises(ValueError, match="not of the form visual-click/<train|test>/<index>"):
        env.reset(options={"task": {"id": "click-7"}})
    with pytest.raises(ValueError, match="a task is"):
        env.reset(options={"task": {"split": "train", "index": -1}})
    with pytest.raises(ValueError, match="do not fit"):
        make_layout("train", 0, size=32, n_buttons=8)


def test_columns_arrangement_fixes_where_buttons_are_not_which_colour_sits_where():
    """arrangement columns: button i is centred in column i at mid-height (so one click per column always
    hits a button), colours and sizes vary; the random arrangement's layouts are unchanged by the option."""
    layouts = [make_layout("train", i, 64, 2, "columns") for i in range(200)]
    for lay in layouts:
        assert [b.contains(16, 32) for b in lay.buttons] == [True, False]
        assert [b.contains(48, 32) for b in lay.buttons] == [False, True]
    assert len({(lay.buttons[0].color, lay.buttons[1].color) for lay in layouts}) > 40
    assert {lay.target for lay in layouts} == {0, 1}
    assert len({lay.buttons[0].x1 - lay.buttons[0].x0 for lay in layouts}) > 3
    assert make_layout("test", 3, 64, 2) == make_layout("test", 3, 64, 2, "random")
    assert make_layout("test", 3, 64, 2) != make_layout("test", 3, 64, 2, "columns")
    with pytest.raises(ValueError, match="columns do not fit"):
        make_layout("train", 0, 32, 8, "columns")


def test_target_color_names_one_colour_on_either_side_and_keeps_the_rest_of_the_layout():
    env = VisualClickEnv(n_buttons=2, arrangement="columns", target_color="red")
    plain = VisualClickEnv(n_buttons=2, arrangement="columns")
    sides = set()
    for i in range(60):
        task = {"split": "test", "index": i}
        messages, info = env.reset(seed=0, options={"task": task})
        plain.reset(seed=0, options={"task": task})
        assert messages[1]["content"][1]["text"] == "Click the red button." and info["target"].color == "red"
        assert [b.color for b in env.layout.buttons].count("red") == 1
        assert env.layout.target == plain.layout.target  # same boxes, same target: only colours swapped
        assert [b.x0 for b in env.layout.buttons] == [b.x0 for b in plain.layout.buttons]
        sides.add(env.layout.target)
    assert sides == {0, 1}


def test_without_the_system_prompt_the_episode_is_the_picture_and_the_instruction():
    env = VisualClickEnv(n_buttons=2, arrangement="columns", system_prompt=False)
    messages, info = env.reset(seed=0, options={"task": {"split": "test", "index": 0}})
    assert [m["role"] for m in messages] == ["user"] and len(message_images(messages)) == 1
    assert mean_reward(oracle_policy, 20, seed=3, n_buttons=2, system_prompt=False)["reward"] == 1.0
