"""The ``docker`` backend: one container per session, driven with the Docker SDK for Python.

The container gets the same contract as the local sandbox: no network, a read-only root, a
size-limited tmpfs /tmp, an unprivileged user, no capabilities, ``no-new-privileges``, memory,
pids and rlimits, and a clean environment. The worker source is passed on the command line
(``python -c``), so it works with a remote engine and any image that has Python 3.10+.
Traffic goes over the container's attached stdin/stdout (Docker's multiplexed stream format).
"""

from __future__ import annotations

import json
import select
import socket
import struct
import time
from typing import Any

from rz_agents.envs.python_tool.limits import MiB, SandboxLimits
from rz_agents.envs.python_tool.local import SANDBOX_ENV, SandboxUnavailable
from rz_agents.envs.python_tool.transport import DeadlineExceeded, Transport, WorkerGone
from rz_agents.envs.python_tool.worker import __file__ as WORKER_FILE

# Built locally from Debian packages by scripts/install.sh --docker (debootstrap + docker import): no
# registry needed. With a registry, any image with Python 3.10+ works, e.g. docker_image="python:3.11-slim".
DEFAULT_IMAGE = "rz-python-sandbox:bookworm"
_MUX_HEADER = struct.Struct(">BxxxI")  # stream type (0 stdin, 1 stdout, 2 stderr), payload size


def docker_run_kwargs(limits: SandboxLimits, image: str = DEFAULT_IMAGE) -> dict[str, Any]:
    """Arguments for ``client.containers.create(**kwargs)`` that start one sandboxed worker."""
    from docker.types import Ulimit

    with open(WORKER_FILE, encoding="utf-8") as f:
        worker_source = f.read()
    # every container runs as uid 65534, so RLIMIT_NPROC would count all of them together: the
    # cgroup pids limit bounds processes instead
    worker_limits = limits.for_worker(own_pid_namespace=True, workdir="/tmp", nproc_rlimit=False)
    return {
        "image": image,
        "command": ["python3", "-I", "-B", "-c", worker_source, json.dumps(worker_limits)],
        "stdin_open": True,
        "tty": False,
        "detach": True,
        "init": True,  # tini as pid 1 reaps orphans; the worker's kill(-1) spares it
        "network_disabled": True,
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {
            "/tmp": f"rw,nosuid,nodev,size={limits.tmp_bytes},mode=1777",
            "/dev/shm": f"rw,nosuid,nodev,size={1 * MiB},mode=1777",
        },
        "user": "65534:65534",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "environment": dict(SANDBOX_ENV),
        "working_dir": "/tmp",
        "mem_limit": limits.memory_bytes,
        "memswap_limit": limits.memory_bytes,
        "pids_limit": limits.processes,
        "nano_cpus": 1_000_000_000,  # one CPU per session
        "ulimits": [
            Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="fsize", soft=limits.file_bytes, hard=limits.file_bytes),
            Ulimit(name="nofile", soft=limits.open_files, hard=limits.open_files),
        ],
        "labels": {"rz_agents.sandbox": "python"},
        "hostname": "sandbox",
    }


class StreamDemux:
    """Splits Docker's multiplexed attach stream into stdout and stderr bytes."""

    def __init__(self) -> None:
        self._pending = b""
        self.stdout = bytearray()
        self.stderr = bytearray()

    def feed(self, data: bytes) -> None:
        """Add raw bytes from the socket; complete chunks move to ``stdout``/``stderr``."""
        self._pending += data
        while len(self._pending) >= _MUX_HEADER.size:
            stream, size = _MUX_HEADER.unpack_from(self._pending)
            if len(self._pending) < _MUX_HEADER.size + size:
                return
            payload = self._pending[_MUX_HEADER.size : _MUX_HEADER.size + size]
            self._pending = self._pending[_MUX_HEADER.size + size :]
            if stream == 1:
                self.stdout += payload
            elif stream == 2:
                self.stderr += payload[-65536:]
                del self.stderr[:-65536]


class DockerWorker(Transport):
    """One worker container and its attached socket."""

    def __init__(self, limits: SandboxLimits, image: str | None = None, client: Any = None) -> None:
        try:
            import docker
        except ImportError:
            raise SandboxUnavailable(
                "the docker backend needs the Docker SDK: pip install 'rz-agents[docker]'"
            ) from None
        try:
            self.client = client or docker.from_env()
            self.container = self.client.containers.create(
                **docker_run_kwargs(limits, image or DEFAULT_IMAGE)
            )
            attached = self.container.attach_socket(
                params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            self.sock: socket.socket = getattr(attached, "_sock", attached)
            self.container.start()
        except docker.errors.DockerException as exc:
            raise SandboxUnavailable(f"the Docker engine is not usable: {exc}") from None
        self.demux = StreamDemux()
        self._dead = False

    def send(self, data: bytes) -> None:
        """Write to the container's stdin."""
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise WorkerGone(str(exc)) from exc

    def recv(self, n: int, deadline: float, watch: bool = True) -> bytes:
        """Read ``n`` bytes of the container's stdout."""
        while len(self.demux.stdout) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded()
            if not select.select([self.sock], [], [], left)[0]:
                continue
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise WorkerGone("end of file")
            self.demux.feed(chunk)
        data = bytes(self.demux.stdout[:n])
        del self.demux.stdout[:n]
        return data

    def exit_description(self) -> str:
        """The container's exit code, with a hint when the OOM killer ended it."""
        try:
            self.container.reload()
            state = self.container.attrs.get("State", {})
            oom = " (out of memory)" if state.get("OOMKilled") else ""
            return f"exit status {state.get('ExitCode')}{oom}"
        except Exception as exc:  # noqa: BLE001 - the engine may be gone too
            return f"unknown ({exc})"

    def stderr_tail(self, limit: int = 2000) -> str:
        """The container's stderr seen so far."""
        return bytes(self.demux.stderr[-limit:]).decode(errors="replace").strip()

    def kill(self) -> None:
        """Remove the container (force: kills it first)."""
        if self._dead:
            return
        self._dead = True
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            self.container.remove(force=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
