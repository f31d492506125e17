"""The ``docker`` provider: OSWorld's Ubuntu VM inside its QEMU-in-Docker image.

The container runs the VM from a qcow2 disk image (mounted read-only at ``/System.qcow2``; the
VM's writes go to an overlay that dies with the container, so every episode starts clean).
Ports published on loopback: the VM's server (5000), Chrome's CDP (9222), VNC (8006) and VLC's
HTTP interface (8080). KVM is used when ``/dev/kvm`` exists, else QEMU emulates (slow).
The container settings are built by ``container_config`` (plain data, unit-tested without an
engine); ``start`` hands them to the Docker SDK.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from rz_agents.envs.osworld.providers.local import Desktop, ProviderError, free_port

DEFAULT_IMAGE = "happysixd/osworld-docker"
VM_PORTS = {"server": 5000, "chromium": 9222, "vnc": 8006, "vlc": 8080}


@dataclass
class DockerSettings:
    """What the container needs: the VM disk and its size, and how much machine to give it."""

    vm_path: str
    image: str = DEFAULT_IMAGE
    disk_size: str = "32G"
    ram_size: str = "4G"
    cpu_cores: int = 4
    kvm: bool | None = None  # None: use /dev/kvm when present
    host_ports: dict[str, int] = field(default_factory=dict)  # VM port name -> host port (0/absent: pick)


def container_config(settings: DockerSettings) -> dict[str, Any]:
    """Keyword arguments for ``docker.from_env().containers.run`` (validated, no engine needed).

    Raises ``ProviderError`` when the VM disk image is missing or a setting is malformed.
    """
    if not settings.vm_path or not os.path.isfile(settings.vm_path):
        raise ProviderError(
            f"the OSWorld VM disk image was not found at {settings.vm_path!r} (a .qcow2 file)"
        )
    if not isinstance(settings.cpu_cores, int) or settings.cpu_cores < 1:
        raise ProviderError(f"cpu_cores must be a positive int, got {settings.cpu_cores!r}")
    for name, value in (("disk_size", settings.disk_size), ("ram_size", settings.ram_size)):
        if not (isinstance(value, str) and value[:-1].isdigit() and value[-1] in "GM"):
            raise ProviderError(f"{name} must look like '32G' or '4096M', got {value!r}")
    unknown = set(settings.host_ports) - set(VM_PORTS)
    if unknown:
        raise ProviderError(f"unknown port names {sorted(unknown)}; expected {sorted(VM_PORTS)}")
    kvm = os.path.exists("/dev/kvm") if settings.kvm is None else settings.kvm
    ports = {
        f"{VM_PORTS[name]}/tcp": ("127.0.0.1", settings.host_ports.get(name) or free_port())
        for name in VM_PORTS
    }
    environment = {
        "DISK_SIZE": settings.disk_size,
        "RAM_SIZE": settings.ram_size,
        "CPU_CORES": str(settings.cpu_cores),
    }
    if not kvm:
        environment["KVM"] = "N"
    return {
        "image": settings.image,
        "environment": environment,
        "cap_add": ["NET_ADMIN"],
        "devices": ["/dev/kvm"] if kvm else [],
        "volumes": {os.path.abspath(settings.vm_path): {"bind": "/System.qcow2", "mode": "ro"}},
        "ports": ports,
        "detach": True,
        "remove": True,
    }


class DockerProvider:
    """Starts one OSWorld VM container per episode and removes it on ``stop``."""

    def __init__(self, vm_path: str = "", boot_timeout_s: float = 600.0, **settings: Any) -> None:
        self.settings = DockerSettings(
            vm_path=vm_path or os.environ.get("RZ_OSWORLD_VM_PATH", ""), **settings
        )
        self.boot_timeout_s = boot_timeout_s
        self.screen_size = (1920, 1080)
        self._container: Any = None
        self.desktop: Desktop | None = None

    def start(self) -> Desktop:
        """Run the container and wait until the VM's server answers."""
        self.stop()
        config = container_config(self.settings)
        try:
            import docker
        except ImportError as exc:
            raise ProviderError(
                "the docker provider needs the Docker SDK: pip install 'rz-agents[docker]'"
            ) from exc
        try:
            client = docker.from_env()
            self._container = client.containers.run(**config)
        except Exception as exc:  # engine absent, image missing, permission denied...
            raise ProviderError(f"could not start the OSWorld container: {exc}") from exc
        server_port = config["ports"]["5000/tcp"][1]
        cdp_port = config["ports"]["9222/tcp"][1]
        url = f"http://127.0.0.1:{server_port}"
        self._wait_for_server(url)
        self.desktop = Desktop(self._container.id[:12], url, cdp_port, "", "", "", sandboxed=True)
        return self.desktop

    def _wait_for_server(self, url: str) -> None:
        import urllib.request

        deadline = time.monotonic() + self.boot_timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "/screenshot", timeout=5):
                    return
            except OSError:
                time.sleep(1)
        self.stop()
        raise ProviderError(f"the OSWorld VM did not answer at {url} within {self.boot_timeout_s:.0f}s")

    def stop(self) -> None:
        """Stop and remove the container (its VM overlay goes with it); safe to call twice."""
        container, self._container = self._container, None
        self.desktop = None
        if container is not None:
            try:
                container.stop(timeout=10)
            except Exception:
                try:
                    container.kill()
                except Exception:
                    pass
