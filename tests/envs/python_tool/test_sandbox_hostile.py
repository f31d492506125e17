"""Hostile programs in the sandbox: each is contained with a clear error, nothing escapes, the
test process is unharmed and the next call works. Every test runs against both backends: bubblewrap
("local") and a Docker container ("docker", skipped where no engine and image are there); where the
two contain a program differently, the test says what each must do."""

import ast
import os
import time

from sandbox_test_support import FAST, assert_healthy, processes_of_uid, sandbox_pids

from rz_agents.envs.python_tool import PythonSandbox, SandboxLimits

# A contained program is stopped at the wall limit (2 s) plus a grace period; unbounded ones would run for
# minutes (sleep(1000), 10**14 iterations). The margin is generous so that a loaded machine cannot fail it.
STOPPED_WITHIN = FAST.wall_s + FAST.grace_s + 20


def only_the_worker_on_the_host(sandbox: PythonSandbox, uid: int) -> bool:
    """Local backend: the sandbox's own uid runs just its worker (no process escaped the call)."""
    return sandbox.backend != "local" or len(processes_of_uid(uid)) == 1


def test_network_access_is_impossible(sandbox):
    r = sandbox.run("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=3)")
    assert r.error == "OSError: [Errno 101] Network is unreachable", r
    r = sandbox.run("import socket\nsocket.getaddrinfo('pypi.org', 443)")
    assert r.error.startswith("gaierror: "), r
    assert_healthy(sandbox)


def test_writing_outside_tmp_fails_and_host_files_are_untouched(sandbox, tmp_path):
    targets = ["/etc/rz_pwned", "/usr/rz_pwned", "/rz_pwned", "/dev/rz_pwned"]
    if sandbox.backend == "local":
        targets.append("/rz/worker.py")  # the worker's own source (a docker worker has it in memory)
    for target in targets:
        r = sandbox.run(f"open({target!r}, 'w').write('x')")
        assert r.error.startswith(
            ("OSError: [Errno 30] Read-only file system", "PermissionError: [Errno 13]")
        ), (
            target,
            r,
        )
    # the host's working tree, tmp dirs and homes are simply not there (an image may have an empty /home)
    r = sandbox.run(
        f"import os; [os.path.exists(p) for p in ({str(tmp_path)!r}, '/work', '/root/.ssh')] + "
        "[os.listdir('/home') if os.path.isdir('/home') else []]"
    )
    assert r.stdout == "[False, False, False, []]\n"
    assert not os.path.exists("/etc/rz_pwned") and not os.path.exists("/rz_pwned")
    assert_healthy(sandbox)


def test_parent_environment_secrets_are_not_readable(monkeypatch, backend):
    monkeypatch.setenv("RZ_TEST_SECRET", "hunter2-secret-value")
    with PythonSandbox(FAST, backend=backend) as sb:
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
    assert time.monotonic() - start < STOPPED_WITHIN
    # the process limit stops it; on a loaded machine the children's spinning may let the wall limit come
    # first
    limit = r.error == "BlockingIOError: [Errno 11] Resource temporarily unavailable"
    assert limit or (r.timed_out and r.error.startswith("TimeoutError: wall time limit")), r
    assert_healthy(sandbox)
    assert only_the_worker_on_the_host(sandbox, uid)


def test_shell_fork_bomb_is_bounded(sandbox):
    uid = int(sandbox.run("import os; os.getuid()").stdout)
    # POSIX sh (dash) syntax: the classic ':(){ :|:& };:' is a syntax error there and would test nothing
    r = sandbox.run("import os\nos.system('bomb() { bomb | bomb & }; bomb')\nimport time; time.sleep(0.5)")
    assert r.error is None and "Cannot fork" in r.stderr, r  # the bomb ran into the process limit
    assert_healthy(sandbox)  # and its leftovers were killed with the call
    assert only_the_worker_on_the_host(sandbox, uid)


def test_memory_bomb_gets_memory_error_and_keeps_the_session(sandbox):
    sandbox.run("keep = 'still here'")
    r = sandbox.run("x = bytearray(4 << 30)")
    assert r.error.startswith("MemoryError")
    # zero-filling ~1 GiB before the limit hits can outlast the 2 s wall limit on a loaded machine: this
    # call gets more wall time, so the memory limit (not the clock) is what stops it
    r = sandbox.run("chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))", timeout_s=60)
    assert r.error.startswith("MemoryError"), r
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
    assert elapsed < STOPPED_WITHIN
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
    if sandbox.backend == "local":
        assert r.error == "PermissionError: [Errno 1] Operation not permitted", r  # pid 1 belongs to root
    else:  # docker's pid 1 (tini) runs as the sandbox user, but SIGKILL from inside cannot kill a pid-1
        assert r.error is None and sandbox_pids(sandbox)[1][0] == 1
    code = (
        "import os, signal, subprocess\np = subprocess.Popen(['sleep', '100'])\nos.kill(-1, signal.SIGKILL)\n"
        "p.wait()"
    )
    assert sandbox.run(code).stdout == "-9\n"  # kill(-1) reaches only the sandbox's own processes
    r = sandbox.run("import os, signal\nos.killpg(0, signal.SIGKILL)")
    assert r.restarted and "died" in r.error
    assert os.getpid() == host_pid
    assert_healthy(sandbox)


def test_signal_games_cannot_defeat_the_time_limit(sandbox):
    for code in (
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True: pass",
        "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM, signal.SIGXCPU])\n"
        "while True: pass",
        "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)",
    ):
        start = time.monotonic()
        r = sandbox.run(code)
        # Either limit may fire first on a loaded machine: the wall clock (the session is restarted) or the
        # CPU-time limit (the call is stopped with an error, the session survives). Both contain the code.
        assert r.timed_out, (code, r)
        assert r.restarted or "CPU time limit" in (r.error or ""), (code, r)
        assert time.monotonic() - start < STOPPED_WITHIN
        assert_healthy(sandbox)
    # a handler set by user code does not survive into the next call
    sandbox.run("import signal\nsignal.signal(signal.SIGALRM, lambda *a: None)")
    assert sandbox.run("while True: pass").timed_out
    assert_healthy(sandbox)


def test_proc_shows_only_the_sandbox(sandbox):
    me, pids = sandbox_pids(sandbox)
    assert pids == sorted({1, me})
    if sandbox.backend == "local":  # pid 1 is bwrap's reaper, owned by another uid; no /sys at all
        expected = {
            "/proc/1/environ": "PermissionError: [Errno 13]",
            "/proc/1/mem": "PermissionError: [Errno 13]",
            "/proc/kcore": "FileNotFoundError",
            "/sys/kernel/uevent_seqnum": "FileNotFoundError",
        }
        write_error = "PermissionError: [Errno 13]"
    else:  # pid 1 is tini (same user, the sandbox's own clean environment); /sys and /proc/sys read-only
        expected = {"/proc/1/mem": "OSError: [Errno 5]", "/proc/kcore": "FileNotFoundError"}
        write_error = "OSError: [Errno 30] Read-only file system"
        r = sandbox.run("open('/proc/1/environ', 'rb').read().split(b'\\0')")
        assert "HOSTNAME=sandbox" in r.stdout and "RZ_" not in r.stdout, r
    for path, error in expected.items():
        r = sandbox.run(f"open({path!r}, 'rb').read(16)")
        assert r.error.startswith(error), (path, r)
    for path in ("/proc/sys/kernel/hostname", "/sys/kernel/uevent_helper"):
        r = sandbox.run(f"open({path!r}, 'w').write('x')")
        assert r.error.startswith(write_error) or r.error.startswith("FileNotFoundError"), (path, r)
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
    assert_healthy(sandbox)  # inside: only pid 1 and the worker
    assert only_the_worker_on_the_host(sandbox, uid)


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


def test_no_host_file_descriptors_are_inherited(tmp_path, backend):
    leaked = open(tmp_path / "host-secret.txt", "w")  # noqa: SIM115
    os.set_inheritable(leaked.fileno(), True)  # even an fd the host forgot to mark close-on-exec
    try:
        with PythonSandbox(FAST, backend=backend) as sb:
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


def test_memory_spread_over_many_processes_is_bounded_per_session(backend):
    limits = SandboxLimits(wall_s=8.0, memory_bytes=512 << 20, session_memory_bytes=768 << 20)
    fork = (
        "for _ in range(6):\n    if os.fork() == 0:\n"
        "        block = b'x' * (300 << 20)  # written, so resident\n"
    )
    with PythonSandbox(limits, backend=backend) as sb:
        start = time.monotonic()
        if backend == "local":  # the session's memory watcher restarts it past session_memory_bytes
            r = sb.run("import os, time\n" + fork + "        time.sleep(60)\ntime.sleep(60)")
            assert r.restarted and "session limit of 768 MiB" in r.error, r
        else:  # the container's memory cgroup (memory_bytes for the whole session) OOM-kills processes
            r = sb.run("import os, time\n" + fork + "        time.sleep(1)\n        os._exit(0)\n"
                       "sorted(os.wait()[1] for _ in range(6))")  # fmt: skip
            statuses = ast.literal_eval(r.stdout)  # wait statuses: 0 exited, 9 killed by SIGKILL
            assert r.error is None and 9 in statuses and set(statuses) <= {0, 9}, r
            memory = sb._worker.container.stats(stream=False)["memory_stats"]
            assert memory["max_usage"] <= memory["limit"] == 512 << 20, memory
        assert time.monotonic() - start < 30  # the program alone would sleep for 60 s
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
