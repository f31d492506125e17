"""WordProblemToolEnv: generated GSM8K-style problems, compact prompt, the real sandbox and rewards."""

import gymnasium
import pytest
from sandbox_test_support import FAST

import rz_agents.envs  # noqa: F401
from rz_agents.envs.word_problem_tool import WordProblemToolEnv
from rz_agents.rewards import MathVerifier
from rz_agents.warmstart.demos import tool_call_text


@pytest.fixture(scope="module")
def verifier():
    v = MathVerifier()
    yield v
    v.close()


def test_generated_problem_solved_by_translating_it_into_code(verifier):
    env = WordProblemToolEnv(limits=FAST, verifier=verifier)
    try:
        obs, info = env.reset(seed=11)
        assert [m["role"] for m in obs] == ["user"] and obs[0]["content"].endswith("?")
        assert info["tools"] == []  # compact: the policy knows its tool from the warm start
        task = env.task
        assert obs[0]["content"] == task["question"] and info["answer"] == task["answer"]
        obs, reward, done, _, step_info = env.step(tool_call_text(task["expression"]))
        assert obs == [{"role": "tool", "content": task["answer"]}] and not done and reward == 0.0
        assert step_info["tool_calls"] == 1
        _, reward, done, _, _ = env.step(f"\\boxed{{{task['answer']}}}")
        assert done and reward == 1.0
        # the same seed gives the same problem; a wrong answer scores 0
        env.reset(seed=11)
        assert env.task == task
        _, reward, done, _, _ = env.step(f"\\boxed{{{int(task['answer']) + 1}}}")
        assert done and reward == 0.0
    finally:
        env.close()


def test_copying_the_story_into_the_call_is_a_syntax_error_not_a_crash(verifier):
    env = WordProblemToolEnv(limits=FAST, verifier=verifier)
    try:
        obs, _ = env.reset(seed=3)
        obs, reward, done, _, info = env.step(tool_call_text(obs[0]["content"]))
        assert not done and reward == 0.0 and info["tool_errors"] == 1
        assert "SyntaxError" in obs[0]["content"]
    finally:
        env.close()


def test_registered_id_and_packaged_tasks(verifier):
    env = gymnasium.make(
        "rz_agents/WordProblemTool-v0", disable_env_checker=True, tasks="gsm8k", verifier=verifier
    ).unwrapped
    try:
        obs, info = env.reset(seed=0)
        assert isinstance(env, WordProblemToolEnv) and info["task_id"].startswith("gsm8k")
        assert obs == [{"role": "user", "content": env.task["question"]}]
    finally:
        env.close()


def test_default_prompt_style_advertises_the_tool(verifier):
    env = WordProblemToolEnv(prompt_style="default", system_prompt="Solve it.", verifier=verifier)
    try:
        obs, info = env.reset(seed=0)
        assert [m["role"] for m in obs] == ["system", "user"] and info["tools"][0]["function"][
            "name"
        ] == "python"
    finally:
        env.close()
