"""The prompt of OSWorld's accessibility-tree text agent, and the history window it keeps.

The system message says what the agent controls and how to answer (pyautogui code, or
computer_13 JSON), then gives the task; every turn the user message carries the current
accessibility tree. Like OSWorld's agent, a policy sees only the last few turns
(``window_messages``), so long episodes fit the model's context.
"""

from __future__ import annotations

from typing import Any

PYAUTOGUI_RULES = """You are an agent that follows my instructions and performs tasks on a Linux desktop \
computer ({w}x{h} pixels) by controlling its mouse and keyboard.
{observed}
Act with Python code using `pyautogui` (already imported, with `time`). Do not use \
`pyautogui.locateCenterOnScreen` (there is no image of the element to look for) nor \
`pyautogui.screenshot()`. Each action is a fresh program: no variable or function survives from \
earlier turns. {coords}, and add small pauses such as `time.sleep(0.5)` between steps that \
need the screen to update.
Return the code in one code block, like this:
```python
pyautogui.click(120, 340)
```
You may also return one of these special codes instead: ```WAIT``` when you must wait for something; \
```FAIL``` when the task cannot be done (try hard before giving up); ```DONE``` when the task is complete.
The computer's password is 'password', in case a command needs sudo.
First think briefly about the current observation and what was done so far, then return the code or \
special code, and nothing else."""

COMPUTER13_RULES = """You are an agent that follows my instructions and performs tasks on a Linux desktop \
computer ({w}x{h} pixels) by controlling its mouse and keyboard.
{observed}
Answer with one action as a JSON object in a code block, like this:
```json
{{"action_type": "CLICK", "parameters": {{"x": 120, "y": 340, "button": "left", "num_clicks": 1}}}}
```
Action types and their parameters: MOVE_TO (x, y), CLICK (x, y, button, num_clicks; all optional), \
MOUSE_DOWN / MOUSE_UP (button), RIGHT_CLICK (x, y), DOUBLE_CLICK (x, y), DRAG_TO (x, y), \
SCROLL (dx, dy), TYPING (text), PRESS (key), KEY_DOWN (key), KEY_UP (key), HOTKEY (keys: a list), \
and the special actions WAIT, FAIL (the task cannot be done) and DONE (the task is complete).
First think briefly about the current observation and what was done so far, then return the action, \
and nothing else."""

# What the agent observes (per observation type) and how it finds coordinates in it.
OBSERVED = {
    "a11y_tree": "Each turn you get an observation of the desktop: its accessibility tree, one element per "
    "line (tag, name, text, class, description, top-left position, size). Predict the next action from it.",
    "screenshot": "Each turn you get an observation of the desktop: a screenshot of the whole screen "
    "({w}x{h} pixels, the pixels your coordinates refer to). Predict the next action from it.",
    "screenshot_a11y_tree": "Each turn you get an observation of the desktop: a screenshot of the whole "
    "screen ({w}x{h} pixels, the pixels your coordinates refer to) and its accessibility tree, one element "
    "per line (tag, name, text, class, description, top-left position, size, in the screenshot's pixels). "
    "Predict the next action from them.",
}
COORDS = {
    "a11y_tree": "Work out the coordinates yourself from the observation (click an element's centre: "
    "its position plus half its size)",
    "screenshot": "Work out the coordinates yourself from the screenshot: pixel positions in the image "
    "(x from the left edge, y from the top), e.g. the centre of the element to click",
    "screenshot_a11y_tree": "Work out the coordinates yourself from the observation: pixel positions "
    "in the screenshot (click an element's centre: its position plus half its size)",
}
OBSERVATION_TYPES = tuple(OBSERVED)

TASK_LINE = "You are asked to complete the following task: {instruction}"
NEXT_STEP = "What's the next step that you will do to help with the task?"
OBSERVATION = "Given the info from accessibility tree as below:\n{tree}\n" + NEXT_STEP
SCREENSHOT_OBSERVATION = "Given the screenshot as below. " + NEXT_STEP
BOTH_OBSERVATION = "Given the screenshot and info from accessibility tree as below:\n{tree}\n" + NEXT_STEP


def system_prompt(
    action_space: str, instruction: str, screen: tuple[int, int], observation: str = "a11y_tree"
) -> str:
    """The system message: the action rules for ``action_space`` and ``observation``, and the task.

    ``screen`` is the size the agent's coordinates refer to: the screen's for the tree, the
    screenshot's (the model's image size) when it sees one.
    """
    if observation not in OBSERVED:
        raise ValueError(f"observation must be one of {OBSERVATION_TYPES}, got {observation!r}")
    rules = PYAUTOGUI_RULES if action_space == "pyautogui" else COMPUTER13_RULES
    w, h = screen
    parts = {"observed": OBSERVED[observation].format(w=w, h=h), "coords": COORDS[observation]}
    return rules.format(w=w, h=h, **parts) + "\n" + TASK_LINE.format(instruction=instruction)


def observation_prompt(
    tree: str | None, errors: list[str] | None = None, observation: str = "a11y_tree"
) -> str:
    """The text of one turn's user message (the previous action's errors first, when it raised);
    with a screenshot, the image part goes after this text (as OSWorld's agent sends it)."""
    if observation == "screenshot":
        text = SCREENSHOT_OBSERVATION
    elif observation == "screenshot_a11y_tree":
        text = BOTH_OBSERVATION.format(tree=tree)
    else:
        text = OBSERVATION.format(tree=tree)
    if errors:
        text = "Your last action raised an error:\n" + "\n".join(errors) + "\n\n" + text
    return text


def window_messages(messages: list[dict[str, Any]], turns: int) -> list[dict[str, Any]]:
    """The system message(s) and the last ``turns`` exchanges before the current observation.

    An exchange is a user observation and the assistant's reply; the last user message (the
    current observation) is always kept. ``turns < 0`` keeps everything.
    """
    head = [m for m in messages[:1] if m["role"] == "system"]
    rest = messages[len(head) :]
    if turns < 0:
        return head + rest
    # rest = u0 a0 u1 a1 ... u_t: keep the last 2 * turns + 1 messages, starting on a user message
    keep = rest[-(2 * turns + 1) :] if rest else []
    while keep and keep[0]["role"] != "user":
        keep = keep[1:]
    return head + keep
