"""Harbor task directories: what the loader reads, and the one-line errors for malformed ones."""

import pytest

from rz_agents.envs.harbor.task import TaskError, find_tasks, load_task, packaged_tasks_dir


def _task(tmp_path, toml='version = "1.0"\n', instruction="<!-- canary GUID x -->\n\nDo the thing.\n"):
    d = tmp_path / "t1"
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "instruction.md").write_text(instruction)
    (d / "task.toml").write_text(toml)
    (d / "environment" / "Dockerfile").write_text("FROM debian:bookworm\nWORKDIR /app\n")
    (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (d / "solution" / "solve.sh").write_text("true\n")
    return d


def test_a_task_directory_reads_its_instruction_limits_and_metadata(tmp_path):
    toml = (
        'version = "1.0"\n[metadata]\ndifficulty = "hard"\ncategory = "git"\n[verifier]\ntimeout_sec = 30.0\n'
        'env = { TOKEN = "x" }\n[agent]\ntimeout_sec = 90\n[environment]\nmemory = "4G"\ncpus = 2\n'
    )
    task = load_task(_task(tmp_path, toml))
    assert task.instruction == "Do the thing."  # the canary comment line is dropped
    assert task.limits.verifier_timeout_s == 30.0 and task.limits.agent_timeout_s == 90.0
    assert task.limits.memory_mb == 4096 and task.limits.cpus == 2.0
    assert (task.difficulty, task.category, task.verifier_env) == ("hard", "git", {"TOKEN": "x"})
    assert task.solution_dir is not None and task.dockerfile is not None


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "tests" / "test.sh").unlink(), "tests/test.sh is missing"),
        (lambda d: (d / "instruction.md").unlink(), "instruction.md is missing"),
        (lambda d: (d / "task.toml").write_text("[agent\n"), "task.toml"),
        (lambda d: (d / "task.toml").write_text("[agent]\ntimeout_sec = -1\n"), "[agent].timeout_sec"),
        (lambda d: (d / "task.toml").write_text('[environment]\nmemory = "lots"\n'), "[environment].memory"),
        (lambda d: (d / "instruction.md").write_text("<!-- canary -->\n\n"), "instruction is empty"),
        (lambda d: (d / "environment" / "Dockerfile").unlink(), "neither environment/Dockerfile"),
    ],
)
def test_a_malformed_task_is_refused_naming_the_file_and_field(tmp_path, damage, message):
    d = _task(tmp_path)
    damage(d)
    with pytest.raises(TaskError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_task(d)


def test_the_packaged_set_spans_the_categories_the_issue_names():
    paths = find_tasks(packaged_tasks_dir())
    assert len(paths) >= 30
    categories = {load_task(p).category for p in paths}
    assert {"files", "text", "git", "python-packaging", "debugging"} <= categories
