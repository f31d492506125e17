"""The docker backend: container arguments and stream handling, without an engine. (With one, the
hostile-program tests in test_sandbox_hostile.py run against real containers.)"""

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from rz_agents.envs.python_tool import PythonSandbox, SandboxLimits, SandboxUnavailable
from rz_agents.envs.python_tool.docker_backend import DEFAULT_IMAGE, StreamDemux, docker_run_kwargs
from rz_agents.envs.python_tool.local import SANDBOX_ENV
from rz_agents.envs.python_tool.worker import HEADER, read_frame, write_frame

ROOT = Path(__file__).resolve().parents[3]
LIMITS = SandboxLimits(memory_bytes=256 << 20, processes=32, tmp_bytes=16 << 20, file_bytes=4 << 20)


def test_the_default_image_is_the_locally_built_one():
    # scripts/docker_sandbox.sh builds it without a registry; a registry image must be asked for
    assert DEFAULT_IMAGE == "rz-python-sandbox:bookworm"
    assert (
        f"IMAGE=${{RZ_SANDBOX_IMAGE:-{DEFAULT_IMAGE}}}"
        in (ROOT / "scripts" / "docker_sandbox.sh").read_text()
    )
    assert docker_run_kwargs(LIMITS)["image"] == DEFAULT_IMAGE


def test_container_is_locked_down():
    kw = docker_run_kwargs(LIMITS, image="python:3.11-slim")
    assert kw["image"] == "python:3.11-slim"
    assert kw["network_disabled"] and kw["network_mode"] == "none"
    assert kw["read_only"] and kw["user"] == "65534:65534" and kw["cap_drop"] == ["ALL"]
    assert kw["security_opt"] == ["no-new-privileges"]
    assert kw["mem_limit"] == kw["memswap_limit"] == 256 << 20 and kw["pids_limit"] == 32
    assert "size=16777216" in kw["tmpfs"]["/tmp"]
    assert kw["stdin_open"] and not kw["tty"] and kw["init"]
    assert kw["environment"] == SANDBOX_ENV  # fixed values, nothing taken from the host environment
    ulimits = {u["Name"]: u["Hard"] for u in kw["ulimits"]}
    assert ulimits["fsize"] == 4 << 20 and ulimits["core"] == 0


def test_container_command_starts_a_working_worker():
    """Run the exact container command (in a bwrap pid namespace instead of a container)."""
    kw = docker_run_kwargs(LIMITS)
    cmd = kw["command"]
    assert cmd[:5] == ["python3", "-I", "-B", "-c", cmd[4]] and json.loads(cmd[5])["nproc_rlimit"] is False
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.skip("bubblewrap is needed to give the worker its own pid namespace")
    argv = [bwrap, "--unshare-pid", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc"]
    argv += ["--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/tmp", "python3", *cmd[1:]]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert read_frame(proc.stdout.fileno())["ready"]
        write_frame(proc.stdin.fileno(), {"code": "a = 20\na + 22", "timeout_s": 5})
        assert read_frame(proc.stdout.fileno())["stdout"] == "42\n"
    finally:
        proc.kill()
        proc.wait()


def mux(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(payload)) + payload


def test_stream_demux_splits_stdout_and_stderr_across_arbitrary_chunks():
    frame = HEADER.pack(5) + b'{"a":'
    raw = mux(1, frame[:3]) + mux(2, b"warning\n") + mux(1, frame[3:]) + mux(1, b"")
    demux = StreamDemux()
    for i in range(0, len(raw), 3):  # deliver 3 bytes at a time
        demux.feed(raw[i : i + 3])
    assert bytes(demux.stdout) == frame and bytes(demux.stderr) == b"warning\n"


def test_docker_backend_without_an_engine_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(SandboxUnavailable, match="Docker engine is not usable"):
        PythonSandbox(backend="docker")


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="backend"):
        PythonSandbox(backend="vm")
