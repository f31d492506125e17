"""GPU cards by device name: HBM bandwidth, memory, bf16 throughput and SM count, for rooflines and estimates.

Every roofline, skipped size and cost-model figure is taken from a ``Card``, never from a constant: the
lent card may be an H100 (3.35 TB/s, 80 GB) or an H200 (4.8 TB/s, 141 GB). ``card_for(name)`` looks the
name torch reports (``torch.cuda.get_device_properties(i).name``, e.g. ``"NVIDIA H100 80GB HBM3"``) up in
a table of datasheet figures; a card missing from the table is described by a measured device-to-device
copy bandwidth when the caller has one, else refused with the table's names.

``achievable_fraction`` is the share of the datasheet bandwidth a streaming kernel reaches (measured on the
H200: ~4.3 of 4.8 TB/s for a device-to-device copy, NOTES-gpu-device.md); the estimate uses it, the bound
does not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

# Reached by a device-to-device copy on the H200 (4.3 / 4.8); used for cards not measured yet.
DEFAULT_ACHIEVABLE_FRACTION = 0.9


@dataclass(frozen=True)
class Card:
    """One GPU's figures. ``hbm_bytes_per_s`` is the datasheet peak (the bound's); ``source`` says where the
    figures came from (``table`` or ``measured copy``)."""

    name: str
    hbm_bytes_per_s: float
    memory_gib: float
    peak_bf16_flops: float
    sms: int
    achievable_fraction: float = DEFAULT_ACHIEVABLE_FRACTION
    source: str = "table"

    @property
    def achievable_bytes_per_s(self) -> float:
        """The bandwidth a streaming kernel reaches (the estimate's, never the bound's)."""
        return self.hbm_bytes_per_s * self.achievable_fraction

    def to_json(self) -> dict:
        return {**asdict(self), "achievable_bytes_per_s": self.achievable_bytes_per_s}


# Keyed by a substring of the device name; the longest matching key wins ("H100 PCIe" before "H100").
# Dense bf16 figures: the H200's measured 770-800 TFLOP/s (NOTES-gpu-device) for the Hopper SXM parts.
CARDS: dict[str, Card] = {
    "H200": Card("H200", 4.8e12, 141.0, 800e12, 132, achievable_fraction=4.3 / 4.8),
    "H100 NVL": Card("H100 NVL", 3.9e12, 94.0, 700e12, 132),
    "H100 PCIe": Card("H100 PCIe", 2.0e12, 80.0, 600e12, 114),
    "H100": Card("H100 SXM", 3.35e12, 80.0, 800e12, 132),
    "A100-SXM4-80GB": Card("A100 80GB", 2.039e12, 80.0, 280e12, 108),
    "A100 80GB": Card("A100 80GB", 1.935e12, 80.0, 280e12, 108),
    "A100": Card("A100 40GB", 1.555e12, 40.0, 280e12, 108),
    "L40S": Card("L40S", 0.864e12, 48.0, 330e12, 142),
    "A10G": Card("A10G", 0.6e12, 24.0, 60e12, 80),
    "L4": Card("L4", 0.3e12, 24.0, 110e12, 58),
    "RTX 4090": Card("RTX 4090", 1.008e12, 24.0, 160e12, 128),
}


def card_for(name: str, memory_bytes: int | None = None, measured_bytes_per_s: float | None = None) -> Card:
    """The card whose table key is the longest substring of ``name`` (case-insensitive), with its memory
    replaced by ``memory_bytes`` when given (what the device reports). A name not in the table needs
    ``measured_bytes_per_s`` (a device-to-device copy: bytes read + written per second), which then serves
    as the achievable bandwidth; without it, ValueError naming the known cards."""
    key = max((k for k in CARDS if k.lower() in name.lower()), key=len, default=None)
    if key is not None:
        card = replace(CARDS[key], name=name)
    elif measured_bytes_per_s:
        # A measured copy is already the achievable figure; its datasheet peak is unknown, so the bound
        # uses it too (stated by the source).
        card = Card(name, measured_bytes_per_s, 0.0, 0.0, 0, achievable_fraction=1.0, source="measured copy")
    else:
        raise ValueError(
            f"unknown GPU {name!r}: not in the card table ({', '.join(CARDS)}) and no measured bandwidth"
        )
    if memory_bytes:
        card = replace(card, memory_gib=round(memory_bytes / 2**30, 1))
    return card
