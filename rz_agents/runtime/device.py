"""Where a run's model lives: `cpu`, `cuda` or `cuda:N`, checked with one clear error."""

from __future__ import annotations

import re

import torch

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


class DeviceError(ValueError):
    """A device string that is malformed or names hardware this machine does not have."""


def check_device_name(name: str, field: str = "model.device") -> None:
    """Raise DeviceError unless `name` is cpu, cuda or cuda:N (says nothing about availability)."""
    if not isinstance(name, str) or not _DEVICE.match(name):
        raise DeviceError(f"{field} must be cpu, cuda or cuda:N, got {name!r}")


def resolve_device(name: str, field: str = "--device") -> torch.device:
    """The torch.device for `name`; raises DeviceError if it is malformed or absent on this machine.

    A CUDA device also needs `triton` (the aligned op set on CUDA is the Triton kernels).
    """
    check_device_name(name, field)
    device = torch.device(name)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise DeviceError(
            f"{field} {name}: no CUDA GPU is available on this machine "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False)"
        )
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise DeviceError(f"{field} {name}: this machine has {count} CUDA device(s)")
    try:
        import triton  # noqa: F401
    except ImportError:
        raise DeviceError(f"{field} {name}: the aligned CUDA kernels need the `triton` package") from None
    return device
