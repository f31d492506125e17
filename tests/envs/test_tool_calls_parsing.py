"""Tool-call parsing: the Qwen3/Hermes format, code blocks, and malformed calls."""

from rz_agents.envs.tool_calls import ToolCall, format_tool_call, parse_tool_calls

PY = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "run code",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}
TOOLS = [PY]


def test_single_and_multiple_calls_in_order():
    text = (
        "Let me compute.\n"
        + format_tool_call("python", {"code": "1+1"})
        + "\nand "
        + format_tool_call("python", {"code": "2+2"})
    )
    turn = parse_tool_calls(text, TOOLS)
    assert turn.calls == [ToolCall("python", {"code": "1+1"}), ToolCall("python", {"code": "2+2"})]
    assert not turn.errors and turn.has_calls


def test_no_call_means_no_items():
    turn = parse_tool_calls(r"The answer is \boxed{4}.", TOOLS)
    assert not turn.has_calls


def test_bad_json_is_an_error_with_position():
    turn = parse_tool_calls('<tool_call>{"name": "python", "arguments": {"code": }</tool_call>', TOOLS)
    assert not turn.calls and "invalid JSON" in turn.errors[0].message


def test_unknown_tool_lists_available_tools():
    turn = parse_tool_calls('<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>', TOOLS)
    assert turn.errors[0].message == "unknown tool 'bash'; available: python"


def test_missing_and_unexpected_and_mistyped_arguments():
    assert (
        "missing required argument(s): code"
        in parse_tool_calls('<tool_call>{"name": "python", "arguments": {}}</tool_call>', TOOLS)
        .errors[0]
        .message
    )
    assert (
        "unexpected argument(s): src"
        in parse_tool_calls(
            '<tool_call>{"name": "python", "arguments": {"code": "1", "src": 2}}</tool_call>', TOOLS
        )
        .errors[0]
        .message
    )
    assert (
        "must be of type string"
        in parse_tool_calls('<tool_call>{"name": "python", "arguments": {"code": 5}}</tool_call>', TOOLS)
        .errors[0]
        .message
    )


def test_unterminated_tag_is_an_error_and_later_calls_still_parse():
    text = '<tool_call>{"name": "python"' + format_tool_call("python", {"code": "3"})
    turn = parse_tool_calls(text, TOOLS)
    assert "unterminated" in turn.errors[0].message
    assert turn.calls == [ToolCall("python", {"code": "3"})]
    assert isinstance(turn.items[0], type(turn.errors[0]))


def test_arguments_as_json_string_are_accepted():
    turn = parse_tool_calls(
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"1\\"}"}</tool_call>', TOOLS
    )
    assert turn.calls == [ToolCall("python", {"code": "1"})]


def test_calls_inside_think_are_ignored():
    text = (
        "<think>maybe "
        + format_tool_call("python", {"code": "0"})
        + "</think>"
        + format_tool_call("python", {"code": "1"})
    )
    assert parse_tool_calls(text, TOOLS).calls == [ToolCall("python", {"code": "1"})]


def test_code_blocks_only_when_enabled():
    text = "```python\nprint(2)\n```"
    assert not parse_tool_calls(text, TOOLS).has_calls
    assert parse_tool_calls(text, TOOLS, code_blocks=True).calls == [
        ToolCall("python", {"code": "print(2)\n"})
    ]
    assert "unterminated" in parse_tool_calls("```python\nx=1", TOOLS, code_blocks=True).errors[0].message


def test_non_object_call_is_an_error():
    assert "JSON object" in parse_tool_calls("<tool_call>[1, 2]</tool_call>", TOOLS).errors[0].message


def test_trailing_text_is_what_follows_the_last_closed_call():
    call = format_tool_call("python", {"code": "1+1"})
    assert parse_tool_calls(call + " \n", TOOLS).trailing_text == ""
    assert (
        parse_tool_calls(call + "</tool_call></tool_call>", TOOLS).trailing_text == "</tool_call></tool_call>"
    )
    assert parse_tool_calls("intro " + call + " so 2", TOOLS).trailing_text == "so 2"
    assert parse_tool_calls(r"no call, \boxed{2}", TOOLS).trailing_text == ""
