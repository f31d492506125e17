"""Parsing the agent's reply into pyautogui code, computer_13 actions or WAIT/DONE/FAIL."""

from __future__ import annotations

import pytest

from rz_agents.envs.osworld.actions import Action, ActionParseError, computer13_to_code, parse_action


def test_code_block_becomes_one_code_action():
    reply = "I will click the button.\n```python\npyautogui.click(10, 20)\n```"
    assert parse_action(reply) == [Action("code", "pyautogui.click(10, 20)")]


def test_several_blocks_become_several_actions_in_order():
    reply = "```python\npyautogui.press('a')\n```\nthen\n```\nWAIT\n```"
    assert [a.kind for a in parse_action(reply)] == ["code", "WAIT"]


@pytest.mark.parametrize("word", ["DONE", "FAIL", "WAIT"])
def test_special_words_bare_fenced_or_last_line(word):
    assert parse_action(word) == [Action(word)]
    assert parse_action(f"```\n{word}\n```") == [Action(word)]
    assert parse_action(f"The task is finished.\n{word}") == [Action(word)]


def test_invalid_python_is_a_clear_error():
    with pytest.raises(ActionParseError, match="not valid Python"):
        parse_action("```python\npyautogui.click(10,\n```")


def test_reply_without_action_says_what_is_expected():
    with pytest.raises(ActionParseError, match="pyautogui"):
        parse_action("I think I should click somewhere")


def test_computer13_click_with_coordinates():
    a = computer13_to_code({"action_type": "CLICK", "parameters": {"x": 5, "y": 7, "num_clicks": 2}})
    assert a.kind == "code" and "pyautogui.click(5.0, 7.0" in a.code and "clicks=2" in a.code
    compile(a.code, "<a>", "exec")


@pytest.mark.parametrize(
    ("action", "fragment"),
    [
        ({"action_type": "TYPING", "parameters": {"text": "it's"}}, 'typewrite("it\'s")'),
        ({"action_type": "HOTKEY", "parameters": {"keys": ["ctrl", "l"]}}, "hotkey('ctrl', 'l')"),
        ({"action_type": "SCROLL", "parameters": {"dy": -3}}, "scroll(-3)"),
        ({"action_type": "DRAG_TO", "parameters": {"x": 1, "y": 2}}, "dragTo(1.0, 2.0"),
        ({"action_type": "PRESS", "parameters": {"key": "enter"}}, "press('enter')"),
    ],
)
def test_computer13_translations_are_valid_pyautogui(action, fragment):
    code = computer13_to_code(action).code
    assert fragment in code
    compile(code, "<a>", "exec")


def test_computer13_json_reply_and_special_word():
    assert parse_action('```json\n{"action_type": "DONE"}\n```', "computer_13") == [Action("DONE")]
    assert parse_action("FAIL", "computer_13") == [Action("FAIL")]


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ({"action_type": "JUMP"}, "unknown action_type"),
        ({"action_type": "MOVE_TO", "parameters": {"x": 1}}, "needs parameters"),
        ({"action_type": "HOTKEY", "parameters": {"keys": []}}, "non-empty list"),
        ({"action_type": "CLICK", "parameters": {"x": "left", "y": 2}}, "bad parameter"),
    ],
)
def test_computer13_errors_name_the_problem(action, message):
    with pytest.raises(ActionParseError, match=message):
        computer13_to_code(action)


def test_unknown_action_space_is_rejected():
    with pytest.raises(ValueError, match="unknown action space"):
        parse_action("DONE", "mouse_only")
