"""A dense model's decode step on a card: a bandwidth bound and a calibrated estimate (gpu_check prints both
beside the measured step).

- **bound**: the bytes a decode step must read (every weight once, every row's K/V) over the card's
  datasheet HBM bandwidth. No step can be faster; it is not a prediction.
- **triton_bound**: the engine's recorded Triton launches at the datasheet bandwidth, each with the launch
  floor (``cost_model``): still a lower bound, of the Triton kernels alone (before issue 54 the README read
  this as a prediction).
- **estimate**: what the step should take, counting what the bounds leave out: the Triton launches at the
  card's *achievable* bandwidth (``Card.achievable_fraction``) with a node floor of ``NODE_S`` each (the
  bound's is 2 us), every other kernel the step runs (the aten
  ops of the decode step, counted on meta tensors by a dispatch mode: each non-view op is one kernel node of
  the captured graph, paying ``NODE_S`` plus its bytes at the achievable bandwidth), the
  sampler's draw (not recorded: ``SAMPLER_KERNELS`` kernels over the rows' fp32 logits, ``SAMPLER_PASSES``
  passes), and the host gap between two replays (``HOST_GAP_S``: the graph launch, the copy of the tokens,
  the scheduler's bookkeeping).

Calibration: the constants below are set from public figures for vLLM-class engines on Hopper (a small-kernel
node in a replayed graph costs 3-5 us, a graph launch plus a device-to-host copy and Python scheduling
30-100 us per step) until a lent GPU measures them; gpu_check's ``engine_decode`` records measured, bound
and estimate side by side so that the next GPU run recalibrates them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rz_agents.compile_check.workloads import EngineDriver, RecipeShapes
from rz_agents.model.config import ModelConfig
from rz_kernels.compile_check.cards import CARDS, Card, card_for
from rz_kernels.compile_check.cost_model import LAUNCH_S, decode_roofline_bytes, step_prediction
from rz_kernels.compile_check.recorder import record_launches

NODE_S = 4.0e-6  # any kernel node in a replayed graph (ramp, tail, the gap to the next): the bound's is 2 us
SAMPLER_KERNELS = 12  # the draw: temperature, exponential noise, argmax, top-p/top-k masks, gathers, copies
SAMPLER_PASSES = 4  # fp32 logits passes the draw makes over every sampled row
HOST_GAP_S = 60e-6  # per step: graph launch, the one pinned copy of the tokens back, the scheduler between
# Allocation and metadata ops: no kernel runs for them.
_NO_KERNEL = (
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "detach", "alias",
)  # fmt: skip


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size() if t.device.type == "meta" else 0


class KernelInventory(TorchDispatchMode):
    """Counts the aten ops that run a kernel on the device (meta tensors): every op but views and
    allocations, with the bytes of its tensor inputs and outputs (each read or written once)."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0
        self.bytes = 0.0
        self.by_op: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.is_view or name in _NO_KERNEL:
            return out
        tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs, out)) if torch.is_tensor(t)]
        if not any(t.device.type == "meta" for t in tensors):
            return out  # host-side index tensors: CPU work before the replay, not a graph node
        self.kernels += 1
        if name.endswith("_"):  # in place (the K/V write): the values in and their copy out, not all of self
            rest = [t for t in torch.utils._pytree.tree_leaves((args[1:], kwargs)) if torch.is_tensor(t)]
            self.bytes += 2 * sum(_nbytes(t) for t in rest)
        else:
            self.bytes += sum(_nbytes(t) for t in tensors)
        self.by_op[name] = self.by_op.get(name, 0) + 1
        return out


def _card(card: Card | str | None) -> Card:
    if card is None:
        return CARDS["H200"]
    return card if isinstance(card, Card) else card_for(card)


@dataclass
class RecordedStep:
    """One decode step's recorded work: its Triton launches and the other kernels' inventory."""

    model: ModelConfig
    batch: int
    context: int
    launches: list
    inventory: KernelInventory


def record_decode_step(model_cfg: ModelConfig, batch: int, context: int) -> RecordedStep:
    """The engine's decode step of ``batch`` rows at ``context`` positions, recorded on meta tensors (no
    GPU): its Triton launches (``record_launches``) and every other kernel (``KernelInventory``)."""
    if batch < 1 or context < 1:
        raise ValueError(f"predict_decode_step: batch and context must be >= 1, got {batch}, {context}")
    shapes = RecipeShapes(
        name="predict", model=model_cfg, max_running=batch, max_len=context + 1,
        max_batch_tokens=max(batch, 8), micro_batch_tokens=2, activation_checkpointing=False,
    )  # fmt: skip
    inventory = KernelInventory()
    with record_launches() as rec:
        engine = EngineDriver(shapes)  # built inside: the Triton op set is selectable only there
        with rec.tagged(model="predict", side="engine", phase="decode", rows=batch, context=context):
            with inventory:
                engine.decode(batch, context)
    return RecordedStep(model_cfg, batch, context, rec.launches, inventory)


def step_figures(step: RecordedStep, card: Card | str | None = None) -> dict[str, Any]:
    """The bound, the Triton launches' bound and the estimate of a recorded step on ``card`` (a Card or a
    device name; default the H200), in ms (module docstring). ``step_ms`` is the Triton bound (the name
    the report has used since issue 37)."""
    card = _card(card)
    batch, context, model_cfg, decode, inventory = (
        step.batch, step.context, step.model, step.launches, step.inventory
    )
    triton = step_prediction(decode, card)
    achievable = card.achievable_bytes_per_s
    triton_est = step_prediction(decode, card, bytes_per_s=achievable)["seconds"]
    triton_est += len(decode) * (NODE_S - LAUNCH_S)  # the estimate's node floor, not the bound's
    other_kernels = inventory.kernels
    other_s = other_kernels * NODE_S + inventory.bytes / achievable
    sampler_s = SAMPLER_KERNELS * NODE_S + SAMPLER_PASSES * batch * model_cfg.vocab_size * 4 / achievable
    estimate = triton_est + other_s + sampler_s + HOST_GAP_S
    out = {
        "card": card.name,
        "batch": batch,
        "context": context,
        "step_ms": triton["seconds"] * 1e3,
        "triton_bound_ms": triton["seconds"] * 1e3,
        "estimate_ms": estimate * 1e3,
        "estimate_terms_ms": {
            "triton_at_achievable_bw": round(triton_est * 1e3, 3),
            "other_kernels": round(other_s * 1e3, 3),
            "sampler": round(sampler_s * 1e3, 3),
            "host_gap": round(HOST_GAP_S * 1e3, 3),
        },
        "triton_launches": triton["launches"],
        "other_kernels": other_kernels,
        "other_kernels_by_op": dict(sorted(inventory.by_op.items(), key=lambda kv: -kv[1])[:8]),
        "launches": triton["launches"],
        "tokens_per_s": batch / triton["seconds"],
        "estimate_tokens_per_s": batch / estimate,
        "by_kernel": triton["by_kernel"],
    }
    if not model_cfg.num_experts:
        bound = decode_roofline_bytes(dataclasses.asdict(model_cfg), batch, context) / card.hbm_bytes_per_s
        out.update(
            bound_ms=bound * 1e3,
            roofline_ms=bound * 1e3,
            fraction_of_roofline=bound / triton["seconds"],
            estimate_fraction_of_bound=bound / estimate,
        )
    return out

def predict_decode_step(
    model_cfg: ModelConfig, batch: int, context: int, card: Card | str | None = None
) -> dict[str, Any]:
    """``step_figures`` of the decode step of ``batch`` rows at ``context`` positions on ``card``."""
    return step_figures(record_decode_step(model_cfg, batch, context), card)
