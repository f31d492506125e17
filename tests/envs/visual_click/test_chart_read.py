"""rz_agents/ChartRead-v0: deterministic charts, a held-out split, the reward, the picture-reading oracle
at 1.0 and random guesses at 1 / max_value."""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import pytest

from rz_agents.envs.visual_click.chart import make_chart, render_chart
from rz_agents.envs.visual_click.chart_env import ENV_ID, ChartReadEnv
from rz_agents.envs.visual_click.policies import chart_oracle_policy, guess_policy, mean_reward
from rz_agents.envs.visual_click.render import PALETTE
from rz_agents.images import message_images


def test_registered_deterministic_and_the_bars_are_value_times_unit_tall():
    env = gymnasium.make(ENV_ID)
    messages, info = env.reset(seed=2)
    (picture,) = message_images(messages)
    again, _ = env.reset(options={"task": {"id": info["task_id"]}})
    assert np.array_equal(message_images(again)[0], picture)
    chart = env.unwrapped.chart
    assert messages[1]["content"][1][
        "text"
    ] == f"What is the value of the {chart.bars[chart.target][0]} bar? " + ("Answer with a number.")
    assert info["answer"] == chart.answer and "0 to 9" in messages[0]["content"]
    for color, value in chart.bars:
        rows = np.nonzero(np.all(picture == PALETTE[color], axis=-1))[0]
        assert rows.max() - rows.min() + 1 == value * chart.unit


def test_the_test_split_is_held_out():
    train = {render_chart(make_chart("train", i)).tobytes() for i in range(200)}
    test = {render_chart(make_chart("test", i)).tobytes() for i in range(200)}
    assert not train & test and len(test) > 150  # (4 bars of 9 values: a few charts repeat within a split)
    assert {ChartReadEnv(num_train_tasks=3).reset(seed=s)[1]["task_id"] for s in range(40)} == {
        f"chart-read/train/{i}" for i in range(3)
    }


def test_reward_is_one_for_the_value_only():
    env = ChartReadEnv(max_turns=2)
    _, info = env.reset(seed=9)
    assert env.step("no idea")[1:3] == (0.0, False)
    assert env.step(f"It reads {info['answer'] % 9 + 1}")[1:4] == (0.0, False, True)
    env.reset(seed=9)
    assert env.step(f"The bar is at {info['answer']}")[1:3] == (1.0, True)


@pytest.mark.parametrize("kwargs", [{}, {"image_size": 128, "n_bars": 8, "max_value": 20}])
def test_the_oracle_reads_the_chart_and_random_guesses_score_chance(kwargs):
    for split in ("train", "test"):
        assert (
            mean_reward(chart_oracle_policy, 60, seed=50, task="chart", split=split, **kwargs)["reward"]
            == 1.0
        )
    n, m = 1000, kwargs.get("max_value", 9)
    got = mean_reward(guess_policy(m, seed=3), n, task="chart", **kwargs)
    assert math.isclose(got["chance"], 1 / m) and abs(got["reward"] - 1 / m) < 4 * math.sqrt(
        (1 / m) * (1 - 1 / m) / n
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"image_size": 600}, "image_size must be an int in"),
        ({"n_bars": 0}, "n_bars must be an int in"),
        ({"max_value": 40}, "max_value must be an int >= 2 with >= 2 pixels a unit"),
        ({"split": "val"}, "split must be one of train, test"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ChartReadEnv(**kwargs)
