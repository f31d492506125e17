"""The text agent's side of OSWorld: tree filtering and linearisation, token budgets, prompts, history
window."""

from __future__ import annotations

from rz_agents.envs.osworld.a11y import HEADER, TRUNCATED, linearize, trim
from rz_agents.envs.osworld.actions import Action, parse_pyautogui
from rz_agents.envs.osworld.prompts import observation_prompt, system_prompt, window_messages

TREE = """<desktop-frame xmlns:st="https://accessibility.ubuntu.example.org/ns/state"
  xmlns:cp="https://accessibility.ubuntu.example.org/ns/component"
  xmlns:attr="https://accessibility.ubuntu.example.org/ns/attributes">
 <application name="soffice">
  <frame name="Untitled 1 - LibreOffice Calc" st:showing="true" st:visible="true" st:enabled="true" cp:screencoord="(0, 0)" cp:size="(1920, 1080)">
   <menu name="File" st:showing="true" st:visible="true" st:enabled="true" cp:screencoord="(4, 30)" cp:size="(40, 20)"/>
   <push-button name="Bold" st:showing="true" st:visible="true" st:enabled="true" cp:screencoord="(300, 60)" cp:size="(24, 24)" attr:class="bold-btn"/>
   <push-button name="Hidden" st:showing="false" st:visible="true" st:enabled="true" cp:screencoord="(300, 60)" cp:size="(24, 24)"/>
   <push-button name="Disabled" st:showing="true" st:visible="true" cp:screencoord="(330, 60)" cp:size="(24, 24)"/>
   <check-box name="Wrap" st:showing="true" st:visible="true" st:checkable="true" cp:screencoord="(360, 60)" cp:size="(24, 24)"/>
   <table-cell name="A1" st:showing="true" st:visible="true" st:editable="true" cp:screencoord="(60, 200)" cp:size="(80, 20)">Say "hi"</table-cell>
   <table-cell name="" st:showing="true" st:visible="true" st:editable="true" cp:screencoord="(140, 200)" cp:size="(80, 20)"/>
   <push-button name="Offscreen" st:showing="true" st:visible="true" st:enabled="true" cp:screencoord="(-5, 60)" cp:size="(24, 24)"/>
   <panel name="Toolbar" st:showing="true" st:visible="true" st:enabled="true" cp:screencoord="(0, 50)" cp:size="(1920, 40)"/>
  </frame>
 </application>
</desktop-frame>"""  # noqa: E501 (a verbatim accessibility tree)


def test_linearize_keeps_what_osworld_keeps():
    lines = linearize(TREE).split("\n")
    assert lines[0] == HEADER
    assert lines[1:] == [
        'menu\tFile\t""\t\t\t(4, 30)\t(40, 20)',
        'push-button\tBold\t""\tbold-btn\t\t(300, 60)\t(24, 24)',
        'check-box\tWrap\t""\t\t\t(360, 60)\t(24, 24)',
        'table-cell\tA1\t"Say ""hi"""\t\t\t(60, 200)\t(80, 20)',
    ]  # frames, panels, hidden, disabled, off-screen and empty nodes are dropped


def test_a_node_that_cannot_be_acted_on_is_dropped_as_osworld_drops_it():
    # judge_node keeps a node only if it is enabled, editable, expandable or checkable
    row = (
        '<push-button name="Go" st:showing="true" st:visible="true" {} cp:screencoord="(1, 1)" '
        'cp:size="(5, 5)"/>'
    )
    head = '<desktop-frame xmlns:st="{}" xmlns:cp="{}">'.format(
        "https://accessibility.ubuntu.example.org/ns/state",
        "https://accessibility.ubuntu.example.org/ns/component",
    )
    for state, kept in [("", False), ('st:focusable="true"', False), ('st:enabled="true"', True),
                        ('st:editable="true"', True), ('st:expandable="true"', True),
                        ('st:checkable="true"', True)]:  # fmt: skip
        rows = linearize(head + row.format(state) + "</desktop-frame>").split("\n")[1:]
        assert (rows == ['push-button\tGo\t""\t\t\t(1, 1)\t(5, 5)']) is kept, state


def test_fallback_tree_without_states_keeps_named_nodes():
    xml = (
        '<desktop-frame name="main"><application name="Chromium"><frame name="Home" screencoord="(0, 0)" '
        'size="(800, 600)"/><link name="About us" screencoord="(10, 20)" size="(50, 12)" text=""/>'
        '</application></desktop-frame>'
    )
    rows = linearize(xml).split("\n")[1:]
    assert [r.split("\t")[:2] for r in rows] == [
        ["application", "Chromium"],
        ["frame", "Home"],
        ["link", "About us"],
    ]
    assert linearize(None) == "(no accessibility tree)" and "unreadable" in linearize("<broken")


def test_trim_cuts_at_line_boundaries_within_budget():
    table = HEADER + "".join(f'\nbutton\tB{i}\t""\t\t\t(1, 1)\t(2, 2)' for i in range(200))
    cut = trim(table, 100, count=lambda s: len(s.split()))
    assert cut.endswith("\n" + TRUNCATED) and len(cut.split()) <= 100
    assert all(line.count("\t") == 6 for line in cut.split("\n")[:-1])  # no half line
    assert trim(table, 10**6) == table


def test_prompts_and_history_window():
    sys_msg = system_prompt("pyautogui", "Make A1 bold.", (1920, 1080))
    assert "1920x1080" in sys_msg and sys_msg.endswith("following task: Make A1 bold.")
    assert '"action_type"' in system_prompt("computer_13", "x", (800, 600))
    obs = observation_prompt("TREE", ["NameError: x"])
    assert (
        obs.startswith("Your last action raised an error:\nNameError: x")
        and "TREE\nWhat's the next step" in obs
    )
    chat = [{"role": "system", "content": "S"}]
    for i in range(5):
        chat += [{"role": "user", "content": f"o{i}"}, {"role": "assistant", "content": f"a{i}"}]
    chat.append({"role": "user", "content": "o5"})
    assert [m["content"] for m in window_messages(chat, 2)] == ["S", "o3", "a3", "o4", "a4", "o5"]
    assert [m["content"] for m in window_messages(chat, 0)] == ["S", "o5"]
    assert window_messages(chat, -1) == chat


def test_code_block_ending_in_a_special_word_is_code_then_the_word():
    actions = parse_pyautogui("Clicking, then finished.\n```python\npyautogui.click(1, 2)\nDONE\n```")
    assert actions == [Action("code", "pyautogui.click(1, 2)"), Action("DONE")]
