"""The docker provider's container settings (built and validated without a Docker engine)."""

from __future__ import annotations

import pytest

from rz_agents.envs.osworld.providers import make_provider
from rz_agents.envs.osworld.providers.docker import DockerSettings, container_config
from rz_agents.envs.osworld.providers.local import ProviderError


@pytest.fixture
def disk(tmp_path):
    p = tmp_path / "Ubuntu.qcow2"
    p.write_bytes(b"QFI\xfb")
    return str(p)


def test_config_mounts_the_disk_read_only_and_publishes_ports_on_loopback(disk):
    cfg = container_config(DockerSettings(vm_path=disk, kvm=True, host_ports={"server": 15000}))
    assert cfg["image"] == "happysixd/osworld-docker"
    assert cfg["volumes"] == {disk: {"bind": "/System.qcow2", "mode": "ro"}}
    assert cfg["ports"]["5000/tcp"] == ("127.0.0.1", 15000)
    assert set(cfg["ports"]) == {"5000/tcp", "9222/tcp", "8006/tcp", "8080/tcp"}
    assert all(host == "127.0.0.1" and port > 0 for host, port in cfg["ports"].values())
    assert cfg["devices"] == ["/dev/kvm"] and "KVM" not in cfg["environment"]
    assert cfg["environment"] == {"DISK_SIZE": "32G", "RAM_SIZE": "4G", "CPU_CORES": "4"}
    assert cfg["cap_add"] == ["NET_ADMIN"] and cfg["detach"] and cfg["remove"]


def test_without_kvm_the_vm_is_emulated(disk):
    cfg = container_config(DockerSettings(vm_path=disk, kvm=False, ram_size="8G", cpu_cores=2))
    assert cfg["devices"] == [] and cfg["environment"]["KVM"] == "N"
    assert cfg["environment"]["RAM_SIZE"] == "8G" and cfg["environment"]["CPU_CORES"] == "2"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"vm_path": "/nonexistent.qcow2"}, "disk image was not found"),
        ({"cpu_cores": 0}, "cpu_cores"),
        ({"ram_size": "lots"}, "ram_size"),
        ({"host_ports": {"ssh": 22}}, "unknown port names"),
    ],
)
def test_bad_settings_are_clear_errors(disk, settings, message):
    kwargs = {"vm_path": disk, **settings}
    with pytest.raises(ProviderError, match=message):
        container_config(DockerSettings(**kwargs))


def test_provider_start_fails_clearly_without_a_disk():
    provider = make_provider("docker", vm_path="/nonexistent.qcow2")
    with pytest.raises(ProviderError, match="disk image"):
        provider.start()
    provider.stop()


def test_unknown_provider_name():
    with pytest.raises(ValueError, match="unknown OSWorld provider"):
        make_provider("vmware")
