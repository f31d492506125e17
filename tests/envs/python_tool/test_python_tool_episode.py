"""Episodes of PythonToolEnv driven by scripted policy outputs."""

import json

import gymnasium
import pytest
from sandbox_test_support import FAST

import rz_agents.envs  # noqa: F401
from rz_agents.envs.python_tool import PythonToolEnv, SandboxPool
from rz_agents.envs.tool_calls import format_tool_call
from rz_agents.rewards import MathVerifier

TASK = {"id": "arith-1", "question": "Compute 37*48+12.", "answer": "1788"}


@pytest.fixture(scope="module")
def verifier():
    v = MathVerifier()
    yield v
    v.close()


@pytest.fixture
def env(verifier):
    e = PythonToolEnv(max_turns=3, limits=FAST, verifier=verifier)
    yield e
    e.close()


def call(code: str) -> str:
    return "I will compute it.\n" + format_tool_call("python", {"code": code})


def test_right_answer_via_the_tool(env):
    obs, info = env.reset(options={"task": TASK})
    assert [m["role"] for m in obs] == ["system", "user"] and "Compute 37*48+12." in obs[1]["content"]
    assert info["tools"][0]["function"]["name"] == "python" and info["task_id"] == "arith-1"
    obs, reward, terminated, truncated, info = env.step(call("x = 37*48+12\nprint(x)"))
    assert obs == [{"role": "tool", "content": "1788"}]
    assert (reward, terminated, truncated) == (0.0, False, False) and info["tool_calls"] == 1
    obs, reward, terminated, truncated, info = env.step(r"The result is \boxed{1788}.")
    assert (obs, reward, terminated, truncated) == ([], 1.0, True, False)
    assert info["correct"] and info["answer"] == "1788"


def test_session_state_persists_across_turns(env):
    env.reset(options={"task": TASK})
    env.step(call("a = 37*48"))
    obs = env.step(call("a + 12"))[0]
    assert obs == [{"role": "tool", "content": "1788"}]


def test_wrong_answer_gets_zero(env):
    env.reset(options={"task": TASK})
    env.step(call("print(37*48)"))
    _, reward, terminated, _, info = env.step(r"\boxed{1776}")
    assert (reward, terminated, info["correct"]) == (0.0, True, False)


def test_malformed_call_gets_an_error_observation_and_the_episode_continues(env):
    env.reset(options={"task": TASK})
    obs, reward, terminated, truncated, info = env.step(
        '<tool_call>{"name": "python", "arguments": {"code": 1+}'
    )
    assert obs[0]["role"] == "tool" and obs[0]["content"].startswith("Error: unterminated <tool_call>")
    assert not terminated and not truncated and info["malformed_calls"] == 1
    obs = env.step('<tool_call>{"name": "shell", "arguments": {}}</tool_call>')[0]
    assert obs[0]["content"] == "Error: unknown tool 'shell'; available: python"
    assert env.step(r"\boxed{1788}")[1] == 1.0


def test_deeply_nested_call_arguments_are_an_error_observation_not_a_recursion_error(env):
    env.reset(options={"task": TASK})
    deep = '{"a": ' * 5000 + "1" + "}" * 5000
    text = '<tool_call>{"name": "python", "arguments": ' + deep + "}</tool_call>"
    obs, reward, terminated, truncated, info = env.step(text)
    assert obs[0]["content"] == "Error: invalid JSON in <tool_call>: nested too deeply"
    assert not terminated and not truncated and info["malformed_calls"] == 1
    # a string-encoded arguments object nested as deep takes the same path
    text = '<tool_call>{"name": "python", "arguments": ' + json.dumps(deep) + "}</tool_call>"
    assert env.step(text)[0][0]["content"].startswith("Error: ")
    assert env.step(r"\boxed{1788}")[1] == 1.0


def test_text_after_the_last_call_costs_the_trailing_text_penalty(verifier):
    with PythonToolEnv(limits=FAST, verifier=verifier, trailing_text_penalty=0.25) as env:
        env.reset(options={"task": TASK})
        padded = call("print(37*48+12)") + "</tool_call></tool_call>\n</tool_call>"
        obs, reward, terminated, _, info = env.step(padded)
        assert obs == [{"role": "tool", "content": "1788"}]  # the call still runs
        assert (reward, terminated, info["trailing_text"]) == (-0.25, False, True)
        obs, reward, _, _, info = env.step(call("print(1)") + "\n  \n")  # whitespace is not text
        assert (reward, info["trailing_text"]) == (0.0, False)
        assert env.step(r"\boxed{1788}")[1] == 1.0


def test_no_call_answers_directly(env):
    env.reset(options={"task": TASK})
    _, reward, terminated, _, _ = env.step(r"37*48+12 = \boxed{1788}")
    assert (reward, terminated) == (1.0, True)


def test_no_call_and_no_box_ends_with_format_penalty(verifier):
    with PythonToolEnv(limits=FAST, verifier=verifier, format_penalty=0.5) as env:
        env.reset(options={"task": TASK})
        _, reward, terminated, _, info = env.step("I think it is 1788")
        assert (reward, terminated, info["answer"]) == (-0.5, True, None)


def test_too_many_turns_truncates(env):
    env.reset(options={"task": TASK})
    for turn in range(3):
        obs, reward, terminated, truncated, info = env.step(call(f"print({turn})"))
    assert obs == [{"role": "tool", "content": "2"}]
    assert (reward, terminated, truncated, info["turn"]) == (0.0, False, True, 3)
    assert env.sandbox is None  # freed at the end of the episode
    with pytest.raises(RuntimeError, match="episode ended"):
        env.step(r"\boxed{1788}")


def test_tool_errors_and_timeouts_are_observations_not_crashes(env):
    env.reset(options={"task": TASK})
    obs = env.step(call("1/0"))[0]
    assert "ZeroDivisionError: division by zero" in obs[0]["content"]
    obs = env.step(call("while True: pass"))[0]
    assert "TimeoutError" in obs[0]["content"]


def test_several_calls_in_one_turn_give_one_tool_message_each(env):
    env.reset(options={"task": TASK})
    text = call("print(1)") + call("print(2)") + '<tool_call>{"bad json</tool_call>'
    obs = env.step(text)[0]
    assert [m["content"] for m in obs[:2]] == ["1", "2"] and obs[2]["content"].startswith(
        "Error: invalid JSON"
    )


def test_code_block_mode_and_compact_prompt(verifier):
    with PythonToolEnv(limits=FAST, verifier=verifier, code_blocks=True, prompt_style="compact") as env:
        obs, _ = env.reset(options={"task": TASK})
        assert obs == [{"role": "user", "content": "Compute 37*48+12."}]
        obs = env.step("```python\nprint(37*48+12)\n```")[0]
        assert obs == [{"role": "tool", "content": "1788"}]


def test_generated_tasks_are_seeded_and_gymnasium_make_works(verifier):
    env = gymnasium.make("rz_agents/PythonTool-v0", difficulty=1, limits=FAST, verifier=verifier)
    obs1, info1 = env.reset(seed=7)
    obs2, info2 = env.reset(seed=7)
    assert obs1 == obs2 and info1["task_id"] == info2["task_id"]
    answer = info1["answer"]
    assert env.step(rf"\boxed{{{answer}}}")[1] == 1.0
    env.close()


def test_tasks_from_a_named_dataset(verifier):
    with PythonToolEnv(tasks="aime25", limits=FAST, verifier=verifier) as env:
        _, info = env.reset(seed=0)
        assert info["task_id"].startswith("aime2025-")


def test_sandbox_pool_gives_each_episode_a_fresh_session(verifier):
    with (
        SandboxPool(size=2, limits=FAST) as pool,
        PythonToolEnv(limits=FAST, sandbox_pool=pool, verifier=verifier) as env,
    ):
        env.reset(options={"task": TASK})
        env.step(call("secret = 1"))
        env.reset(options={"task": TASK})
        assert "NameError" in env.step(call("secret"))[0][0]["content"]


def test_bad_task_is_a_clear_error(env):
    with pytest.raises(ValueError, match="'answer'"):
        env.reset(options={"task": {"question": "q"}})


def test_without_prewarm_the_sandbox_starts_at_the_first_call(verifier):
    with PythonToolEnv(limits=FAST, verifier=verifier, prewarm=False) as env:
        env.reset(options={"task": TASK})
        assert env.sandbox is None
        assert env.step(call("6*7"))[0] == [{"role": "tool", "content": "42"}]
        assert env.sandbox is not None
