"""Agent actions: parse the policy's reply into ``pyautogui`` code or ``computer_13`` dicts.

Two action spaces, as in OSWorld:

* ``pyautogui``: the reply holds Python code in a fenced block (```` ```python ... ``` ````) that
  runs inside the desktop with ``pyautogui`` imported, or one of the special words ``WAIT``,
  ``DONE``, ``FAIL`` (bare or in a block).
* ``computer_13``: the reply holds a JSON object ``{"action_type": ..., "parameters": {...}}``
  (or a list of them); each is translated to the equivalent ``pyautogui`` call.

A reply that cannot be parsed raises ``ActionParseError`` whose message is shown to the agent as
its next observation; the episode goes on.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

SPECIAL = ("WAIT", "DONE", "FAIL")
ACTION_SPACES = ("pyautogui", "computer_13")

# computer_13 action types and the parameters each requires.
COMPUTER_13: dict[str, tuple[str, ...]] = {
    "MOVE_TO": ("x", "y"),
    "CLICK": (),
    "MOUSE_DOWN": (),
    "MOUSE_UP": (),
    "RIGHT_CLICK": (),
    "DOUBLE_CLICK": (),
    "DRAG_TO": ("x", "y"),
    "SCROLL": (),
    "TYPING": ("text",),
    "PRESS": ("key",),
    "KEY_DOWN": ("key",),
    "KEY_UP": ("key",),
    "HOTKEY": ("keys",),
    "WAIT": (),
    "FAIL": (),
    "DONE": (),
}

_BUTTON_CALLS = {"MOUSE_DOWN": "mouseDown", "MOUSE_UP": "mouseUp"}
_KEY_CALLS = {"PRESS": "press", "KEY_DOWN": "keyDown", "KEY_UP": "keyUp"}

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n?(.*?)```", re.S)


class ActionParseError(ValueError):
    """The reply holds no valid action; the message tells the agent what is expected."""


@dataclass(frozen=True)
class Action:
    """One action: ``kind`` is ``"code"`` (run ``code``) or one of ``WAIT``/``DONE``/``FAIL``."""

    kind: str
    code: str = ""

    @property
    def label(self) -> str:
        """What the action history records: the special word or the code."""
        return self.kind if self.kind in SPECIAL else self.code


def _check_python(code: str) -> None:
    try:
        ast.parse(code)
    except SyntaxError as exc:
        raise ActionParseError(
            f"the code block is not valid Python (line {exc.lineno}: {exc.msg}); "
            "reply with one ```python``` block of pyautogui code, or WAIT, DONE or FAIL"
        ) from exc


def parse_pyautogui(reply: str) -> list[Action]:
    """Parse a ``pyautogui``-space reply into actions (one per code block or special word)."""
    if not isinstance(reply, str):
        raise ActionParseError(f"the reply must be text, got {type(reply).__name__}")
    text = reply.strip()
    if text in SPECIAL:
        return [Action(text)]
    actions: list[Action] = []
    for _lang, body in _FENCE.findall(text):
        body = body.strip()
        lines = body.splitlines()
        if body in SPECIAL:
            actions.append(Action(body))
        elif lines and lines[-1].strip() in SPECIAL:  # code, then a special word (as OSWorld parses it)
            code = "\n".join(lines[:-1]).strip()
            if code:
                _check_python(code)
                actions.append(Action("code", code))
            actions.append(Action(lines[-1].strip()))
        elif body:
            _check_python(body)
            actions.append(Action("code", body))
    if actions:
        return actions
    # A special word as the reply's last line (after some reasoning) counts too.
    last = text.splitlines()[-1].strip().strip("`'\".") if text else ""
    if last in SPECIAL:
        return [Action(last)]
    raise ActionParseError(
        "no action found: reply with one ```python``` code block using pyautogui "
        "(e.g. ```python\npyautogui.click(100, 200)\n```), or with WAIT, DONE or FAIL"
    )


def _xy(params: dict[str, Any]) -> str:
    if "x" in params and "y" in params:
        return f"{float(params['x'])!r}, {float(params['y'])!r}"
    return ""


def computer13_to_code(action: dict[str, Any]) -> Action:
    """Translate one ``computer_13`` dict into an ``Action`` (pyautogui code or special word)."""
    if not isinstance(action, dict):
        raise ActionParseError(f"a computer_13 action must be an object, got {type(action).__name__}")
    kind = action.get("action_type")
    if kind not in COMPUTER_13:
        raise ActionParseError(f"unknown action_type {kind!r}; expected one of {', '.join(COMPUTER_13)}")
    params = action.get("parameters", {}) or {}
    if not isinstance(params, dict):
        raise ActionParseError(f"{kind}: 'parameters' must be an object")
    missing = [p for p in COMPUTER_13[kind] if p not in params]
    if missing:
        raise ActionParseError(f"{kind} needs parameters {missing}")
    if kind in SPECIAL:
        return Action(kind)
    try:
        button = repr(str(params.get("button", "left")))
        if kind == "MOVE_TO":
            code = f"pyautogui.moveTo({_xy(params)})"
        elif kind in ("CLICK", "RIGHT_CLICK", "DOUBLE_CLICK"):
            args = [_xy(params)] if _xy(params) else []
            if kind == "CLICK":
                args += [f"button={button}", f"clicks={int(params.get('num_clicks', 1))}"]
                code = f"pyautogui.click({', '.join(args)})"
            else:
                fn = "rightClick" if kind == "RIGHT_CLICK" else "doubleClick"
                code = f"pyautogui.{fn}({', '.join(args)})"
        elif kind in _BUTTON_CALLS:
            code = f"pyautogui.{_BUTTON_CALLS[kind]}(button={button})"
        elif kind == "DRAG_TO":
            code = f"pyautogui.dragTo({_xy(params)}, duration=0.5, button='left')"
        elif kind == "SCROLL":
            dx, dy = int(params.get("dx", 0)), int(params.get("dy", 0))
            lines = []
            if dy:
                lines.append(f"pyautogui.scroll({dy})")
            if dx:
                lines.append(f"pyautogui.hscroll({dx})")
            code = "\n".join(lines) or "pass"
        elif kind == "TYPING":
            code = f"pyautogui.typewrite({str(params['text'])!r})"
        elif kind in _KEY_CALLS:
            code = f"pyautogui.{_KEY_CALLS[kind]}({str(params['key'])!r})"
        else:  # HOTKEY
            keys = params["keys"]
            if not isinstance(keys, list) or not keys:
                raise ActionParseError("HOTKEY needs 'keys' as a non-empty list")
            code = f"pyautogui.hotkey({', '.join(repr(str(k)) for k in keys)})"
    except (TypeError, ValueError) as exc:
        raise ActionParseError(f"{kind}: bad parameter value ({exc})") from exc
    return Action("code", code)


def parse_computer13(reply: str | dict | list) -> list[Action]:
    """Parse a ``computer_13`` reply (JSON text, possibly fenced, or already a dict/list)."""
    obj: Any = reply
    if isinstance(reply, str):
        text = reply.strip()
        if text in SPECIAL:
            return [Action(text)]
        blocks = [b.strip() for _lang, b in _FENCE.findall(text)]
        candidates = blocks or [text]
        for cand in candidates:
            if cand in SPECIAL:
                return [Action(cand)]
            try:
                obj = json.loads(cand)
                break
            except json.JSONDecodeError:
                obj = None
        if obj is None:
            raise ActionParseError(
                'no computer_13 action found: reply with a JSON object like {"action_type": "CLICK", '
                '"parameters": {"x": 100, "y": 200}}, or WAIT, DONE or FAIL'
            )
    items = obj if isinstance(obj, list) else [obj]
    if not items:
        raise ActionParseError("empty action list")
    return [computer13_to_code(a) for a in items]


def parse_action(reply: Any, action_space: str = "pyautogui") -> list[Action]:
    """Parse ``reply`` in ``action_space`` (``pyautogui`` or ``computer_13``)."""
    if action_space == "pyautogui":
        if isinstance(reply, (dict, list)):
            raise ActionParseError("the pyautogui action space takes code text, not a dict")
        return parse_pyautogui(reply)
    if action_space == "computer_13":
        return parse_computer13(reply)
    raise ValueError(f"unknown action space {action_space!r}; expected one of {ACTION_SPACES}")
