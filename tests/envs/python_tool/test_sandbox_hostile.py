"""Hostile programs in the sandbox: each is contained with a clear error, nothing escapes, the
test process is unharmed and the next call works."""

import os
import time

from sandbox_test_support import FAST, assert_healthy, processes_of_uid

from rz_agents.envs.python_tool import PythonSandbox, SandboxLimits


def test_network_access_is_impossible(sandbox):
    r = sandbox.run("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=3)")
    assert r.error is not None and ("unreachable" in r.error.lower() or "OSError" in r.error), r
    r = sandbox.run("import socket\nsocket.getaddrinfo('pypi.org', 443)")
    assert r.error is not None
    assert_healthy(sandbox)


def test_writing_outside_tmp_fails_and_host_files_are_untouched(sandbox, tmp_path):
    for target in ("/etc/rz_pwned", "/usr/rz_pwned", "/rz/worker.py", "/rz_pwned", "/dev/rz_pwned"):
        r = sandbox.run(f"open({target!r}, 'w').write('x')")
        assert r.error is not None and ("Read-only" in r.error or "Permission" in r.error), (target, r)
    # the host's working tree and tmp dirs are simply not there
    r = sandbox.run(
        f"import os; [os.path.exists(p) for p in ({str(tmp_path)!r}, '/work', '/root/.ssh', '/home')]"
    )
    assert r.stdout == "[False, False, False, False]\n"
    assert not os.path.exists("/etc/rz_pwned") and not os.path.exists("/rz_pwned")
    assert_healthy(sandbox)


def test_parent_environment_secrets_are_not_readable(monkeypatch):
    monkeypatch.setenv("RZ_TEST_SECRET", "hunter2-secret-value")
    with PythonSandbox(FAST) as sb:
        code = (
            "import os, glob\nout = [repr(dict(os.environ))]\n"
            "for p in glob.glob('/proc/*/environ'):\n"
            "    try: out.append(open(p, 'rb').read().decode(errors='replace'))\n"
            "    except OSError as e: out.append(str(e))\n"
            "print('\\n'.join(out))"
        )
        r = sb.run(code)
        assert r.error is None
        assert "hunter2" not in r.stdout and "RZ_TEST_SECRET" not in r.stdout
        assert "PATH" in r.stdout  # it did read its own (clean) environment
        assert_healthy(sb)


def test_fork_bomb_is_bounded_by_the_process_limit(sandbox):
    uid = int(sandbox.run("import os; os.getuid()").stdout)
    start = time.monotonic()
    r = sandbox.run("import os\nwhile True:\n    os.fork()")
    assert time.monotonic() - start < FAST.wall_s + FAST.grace_s + 5
    assert r.error is not None, r  # BlockingIOError (resource temporarily unavailable) or a timeout
    assert_healthy(sandbox)
    assert len(processes_of_uid(uid)) == 1  # only the worker is left on the host


def test_shell_fork_bomb_is_bounded(sandbox):
    r = sandbox.run("import os\nos.system(':(){ :|:& };:')\nimport time; time.sleep(0.5)")
    assert r.error is None or r.timed_out
    assert_healthy(sandbox)


def test_memory_bomb_gets_memory_error_and_keeps_the_session(sandbox):
    sandbox.run("keep = 'still here'")
    r = sandbox.run("x = bytearray(4 << 30)")
    assert r.error.startswith("MemoryError")
    r = sandbox.run("chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))")
    assert r.error.startswith("MemoryError")
    sandbox.run("del chunks")
    assert sandbox.run("keep").stdout == "'still here'\n"
    assert_healthy(sandbox)


def test_infinite_python_loop_times_out_and_keeps_the_session(sandbox):
    sandbox.run("keep = 1")
    r = sandbox.run("while True:\n    pass")
    assert r.timed_out and "TimeoutError" in r.error and not r.restarted
    r = sandbox.run("try:\n    while True: pass\nexcept Exception:\n    pass")  # BaseException escapes
    assert r.timed_out
    assert sandbox.run("keep").stdout == "1\n"
    assert_healthy(sandbox)


def test_cpu_spin_in_c_code_is_killed_at_the_wall_limit(sandbox):
    start = time.monotonic()
    r = sandbox.run("import itertools\nsum(itertools.repeat(1, 10**14))")
    elapsed = time.monotonic() - start
    assert r.timed_out and r.restarted and "restarted" in r.error
    assert elapsed < FAST.wall_s + FAST.grace_s + 2
    assert_healthy(sandbox)


def test_output_flood_is_cut_keeping_head_and_tail(sandbox):
    r = sandbox.run("i = 0\nwhile True:\n    print(i, 'x' * 1000)\n    i += 1")
    assert r.error is not None and "File too large" in r.error, r.error
    assert r.stdout.startswith("0 xxx") and "bytes of output cut" in r.stdout
    assert len(r.stdout) < FAST.output_bytes + 200
    r = sandbox.run("import os\n_ = os.write(1, b'y' * (1 << 20)); _ = os.write(1, b'END')")
    assert r.stdout.endswith("END") and "bytes of output cut" in r.stdout
    assert_healthy(sandbox)


def test_huge_file_and_filling_tmp_are_refused(sandbox):
    r = sandbox.run("f = open('/tmp/big', 'wb')\nwhile True:\n    f.write(b'0' * (1 << 20))")
    assert "File too large" in r.error
    code = "for i in range(100):\n    with open(f'/tmp/f{i}', 'wb') as f:\n        f.write(b'0' * (7 << 20))"
    r = sandbox.run(code)
    assert "No space left" in r.error
    assert_healthy(sandbox)


def test_killing_the_parent_or_everything_only_hurts_the_sandbox(sandbox):
    host_pid = os.getpid()
    r = sandbox.run(f"import os\nos.kill({host_pid}, 9)")
    assert "ProcessLookupError" in r.error  # the host is not even visible
    r = sandbox.run("import os\nos.kill(os.getppid(), 9)")
    assert r.error is not None  # pid 1 belongs to root: EPERM
    code = "import os, signal, subprocess\np = subprocess.Popen(['sleep', '100'])\nos.kill(-1, signal.SIGKILL)\np.wait()"
    assert sandbox.run(code).stdout == "-9\n"  # kill(-1) reaches only the sandbox's own processes
    r = sandbox.run("import os, signal\nos.killpg(0, signal.SIGKILL)")
    assert r.restarted and "died" in r.error
    assert os.getpid() == host_pid
    assert_healthy(sandbox)


def test_signal_games_cannot_defeat_the_time_limit(sandbox):
    for code in (
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True: pass",
        "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM, signal.SIGXCPU])\nwhile True: pass",
        "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)",
    ):
        start = time.monotonic()
        r = sandbox.run(code)
        # Either limit may fire first on a loaded machine: the wall clock (the session is restarted) or the
        # CPU-time limit (the call is stopped with an error, the session survives). Both contain the code.
        assert r.timed_out, (code, r)
        assert r.restarted or "CPU time limit" in (r.error or ""), (code, r)
        assert time.monotonic() - start < FAST.wall_s + FAST.grace_s + 2
        assert_healthy(sandbox)
    # a handler set by user code does not survive into the next call
    sandbox.run("import signal\nsignal.signal(signal.SIGALRM, lambda *a: None)")
    assert sandbox.run("while True: pass").timed_out
    assert_healthy(sandbox)


def test_proc_shows_only_the_sandbox(sandbox):
    r = sandbox.run("import os\nsorted(p for p in os.listdir('/proc') if p.isdigit())")
    assert r.stdout in ("['1', '2']\n", "['1', '3']\n")
    for path in ("/proc/1/environ", "/proc/1/mem", "/proc/kcore", "/sys/kernel"):
        r = sandbox.run(f"open({path!r}, 'rb').read(16)")
        assert r.error is not None, path
    r = sandbox.run("open('/proc/sys/kernel/hostname', 'w').write('x')")
    assert r.error is not None
    assert_healthy(sandbox)


def test_background_processes_do_not_outlive_the_call(sandbox):
    uid = int(sandbox.run("import os; os.getuid()").stdout)
    code = (
        "import os, subprocess\n"
        "subprocess.Popen(['sleep', '1000'])\n"
        "os.system('sleep 1000 &')\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        import time; time.sleep(1000)\n"
        "    os._exit(0)\n"
    )
    r = sandbox.run(code)
    assert r.error is None, r
    assert_healthy(sandbox)
    assert len(processes_of_uid(uid)) == 1


def test_leftover_thread_restarts_the_session(sandbox):
    r = sandbox.run(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(1000,), daemon=True).start()"
    )
    assert r.restarted and "threads" in r.stderr
    assert_healthy(sandbox)


def test_closing_the_control_pipe_restarts_the_session(sandbox):
    r = sandbox.run("import os\nfor fd in range(3, 64):\n    try: os.close(fd)\n    except OSError: pass")
    assert r.restarted
    assert_healthy(sandbox)


def test_no_host_file_descriptors_are_inherited(tmp_path):
    leaked = open(tmp_path / "host-secret.txt", "w")  # noqa: SIM115
    os.set_inheritable(leaked.fileno(), True)  # even an fd the host forgot to mark close-on-exec
    try:
        with PythonSandbox(FAST) as sb:
            code = (
                "import os\nout = []\nfor fd in os.listdir('/proc/self/fd'):\n"
                "    try: out.append(os.readlink(f'/proc/self/fd/{fd}'))\n"
                "    except OSError: pass\nout"
            )
            r = sb.run(code)
            assert r.error is None and "/dev/null" in r.stdout and "memfd:stdout" in r.stdout, r
            targets = r.stdout
            assert "host-secret" not in targets
            assert str(tmp_path) not in targets
    finally:
        leaked.close()


def test_memory_spread_over_many_processes_is_bounded_per_session():
    limits = SandboxLimits(wall_s=8.0, memory_bytes=512 << 20, session_memory_bytes=768 << 20)
    code = (
        "import os, time\n"
        "for _ in range(6):\n"
        "    if os.fork() == 0:\n"
        "        block = b'x' * (300 << 20)  # written, so resident\n"
        "        time.sleep(60)\n"
        "time.sleep(60)"
    )
    with PythonSandbox(limits) as sb:
        start = time.monotonic()
        r = sb.run(code)
        assert r.restarted and "session limit of 768 MiB" in r.error, r
        assert time.monotonic() - start < 8
        assert_healthy(sb)


def test_open_file_limit_holds(sandbox):
    r = sandbox.run("files = [open('/dev/null') for _ in range(100000)]")
    assert r.error is not None and "Too many open files" in r.error
    assert_healthy(sandbox)


def test_nested_user_namespaces_are_refused(sandbox):
    # a user namespace would give the code a fresh set of capabilities to attack the kernel with
    r = sandbox.run(
        "import subprocess\nsubprocess.run(['unshare', '--user', '--map-root-user', 'id']).returncode"
    )
    assert r.error is None and r.stdout == "1\n" and "Operation not permitted" in r.stderr, r
    assert_healthy(sandbox)
