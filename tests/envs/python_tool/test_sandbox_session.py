"""PythonSandbox as a persistent notebook-like session."""

import os

import pytest

from rz_agents.envs.python_tool import PythonSandbox, SandboxLimits, SandboxUnavailable, local


def test_variables_and_imports_survive_between_calls(sandbox):
    assert sandbox.run("import math\nx = 6").ok
    assert sandbox.run("print(math.factorial(x))").stdout == "720\n"


def test_trailing_expression_value_is_shown_like_a_notebook(sandbox):
    assert sandbox.run("y = 2\ny ** 10").stdout == "1024\n"
    assert sandbox.run("None").stdout == ""
    assert sandbox.run("'a' + 'b'").stdout == "'ab'\n"


def test_exception_gives_short_error_and_user_traceback_only(sandbox):
    r = sandbox.run("def f():\n    return 1/0\nf()")
    assert r.error == "ZeroDivisionError: division by zero"
    assert "<cell" in r.stderr and "worker.py" not in r.stderr
    assert sandbox.run("1+1").stdout == "2\n"


def test_syntax_error_is_reported(sandbox):
    r = sandbox.run("def (")
    assert r.error.startswith("SyntaxError") and not r.timed_out


def test_stdout_and_stderr_are_captured_including_c_level_and_subprocess_writes(sandbox):
    code = "import os, sys, subprocess\nprint('a')\nsys.stderr.write('b\\n')\nos.write(1, b'c\\n')\n"
    code += "subprocess.run(['echo', 'd'])"
    r = sandbox.run(code)
    assert r.stdout.split() == ["a", "c", "d"] or r.stdout.startswith("a\nc\nd\n")
    assert r.stderr == "b\n"


def test_sys_exit_does_not_end_the_session(sandbox):
    sandbox.run("keep = 5")
    r = sandbox.run("import sys; sys.exit(3)")
    assert r.error == "SystemExit: 3"
    assert sandbox.run("keep").stdout == "5\n"


def test_close_kills_the_worker_and_run_after_close_is_an_error():
    sb = PythonSandbox()
    assert sb.run("1").ok
    proc = sb._worker.proc
    sb.close()
    assert proc.poll() is not None
    sb.close()  # twice is fine
    with pytest.raises(RuntimeError, match="after close"):
        sb.run("1")


def test_warm_calls_reuse_one_interpreter_instead_of_starting_one_each(sandbox):
    # (milliseconds per call: bench/sandbox.py measures it; a wall-clock bound here would be flaky)
    worker = sandbox._worker  # the bubblewrap process, or the container
    pids = {sandbox.run("import os; os.getpid()").stdout for _ in range(20)}
    assert len(pids) == 1 and sandbox._worker is worker


def test_private_tmp_is_writable_and_invisible_to_the_host(sandbox):
    name = f"rz-test-{os.getpid()}"
    r = sandbox.run(f"open('/tmp/{name}', 'w').write('hi'); open('/tmp/{name}').read()")
    assert r.stdout == "'hi'\n"
    assert not os.path.exists(f"/tmp/{name}")


def test_bad_limits_and_code_type_are_clear_errors():
    with pytest.raises(ValueError, match="wall_s"):
        SandboxLimits(wall_s=0)
    with PythonSandbox() as sb:
        with pytest.raises(TypeError, match="str"):
            sb.run(b"1")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout_s"):
            sb.run("1", timeout_s=0)
        assert sb.run("1").stdout == "1\n"


def test_missing_bubblewrap_refuses_to_run_unsandboxed_unless_allowed(monkeypatch):
    local.bwrap_problem.cache_clear()
    monkeypatch.setenv("PATH", "/nonexistent")
    try:
        with pytest.raises(SandboxUnavailable, match="bubblewrap.*allow_unsandboxed=True"):
            PythonSandbox()
        with PythonSandbox(allow_unsandboxed=True) as sb:
            assert not sb.sandboxed
            assert sb.run("import os; x = 3; x * 2").stdout == "6\n"
            assert "RZ" not in sb.run("print(dict(os.environ))").stdout
            r = sb.run("import subprocess; subprocess.Popen(['/bin/sleep', '100']).pid")
            pid = int(r.stdout)
            sb.run("0")
            assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]
    finally:
        monkeypatch.undo()
        local.bwrap_problem.cache_clear()
