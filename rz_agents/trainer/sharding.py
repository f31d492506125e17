"""Learner ranks: a batch's micro-batches spread over the ranks of a torch.distributed group, the model
sharded with PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``).

The ``Learner`` runs one code for one process and for N ranks; what differs is behind ``SingleProcess`` (no
collectives) or ``ShardedRanks`` (FSDP2). Every rank receives the whole batch, computes the same micro-batch
plan, runs the micro-batches ``i`` with ``i % world == rank``, and the ranks then sum one tensor holding every
rank's log-probs and per-micro-batch losses (zeros elsewhere), so the metrics and the reported loss are the
one-process values, bit for bit.

Why lag-0 tokens stay bit-identical to the engine: FSDP2 all-gathers each layer's full parameters before
its forward (a concatenation, exact; with a bf16 compute dtype each fp32 shard is rounded to bf16 first, the
same rounding the one-process learner applies to its fp32 masters), and the forward runs the model's own
op set on them. Per-sequence log-probs do not depend on which rank or which packing computes them.

Why the gradients (and so the updated weights) are not bitwise those of one process: each rank sums the
gradients of its own micro-batches, FSDP2 reduce-scatters (sums) the ranks' partial sums, and the gradient
norm of a sharded gradient is assembled from per-shard partial sums. The same terms are added in another
grouping, so results agree to float rounding (tests/trainer/test_trainer_sharding.py states the tolerance).

gloo on CPU (torch 2.13) implements all_gather_into_tensor and reduce_scatter_tensor with SUM, but not
ReduceOp.AVG or PREMUL_SUM, which FSDP2 uses by default to average gradients. The learner's loss is already
normalised over the whole batch, so gradients must be summed over ranks anyway: every FSDP module gets a
gradient divide factor of 1 with sum-only reductions (plain SUM reduce-scatter, no division).

With LoRA adapters (``learner.lora``) only the frozen base is sharded (kept in the model's dtype: no master
needs it); the adapters stay whole on every rank (FSDP2's ``ignored_params``), with fp32 masters and AdamW
state replicated, and ``shards_trained`` is False. Their gradients are not reduce-scattered: after each round
of micro-batches (one per rank) the ranks all-gather that round's per-micro-batch adapter gradients, and every
rank adds them into its sums in micro-batch order, exactly as one process accumulates them
(trainer/replicated_grads.py). So a sharded LoRA learner's gradients, norm, AdamW step and adapters are the
one-process learner's bit for bit (tests/trainer/test_trainer_lora_sharding.py).

Every tensor a collective here sends lives on the group's collective device (``collective_device``): NCCL
takes CUDA tensors only, so a CPU flag all-reduced on an NCCL group fails ("No backend type associated with
device type cpu"). The learner exchanges its step's figures in one ``reduce_sum`` per step, never per
micro-batch and never as pickled objects.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def accepted_devices(backend: str) -> list[str]:
    """The device types whose tensors a process group with ``backend`` takes ("gloo", "nccl",
    "cpu:gloo,cuda:nccl", or a backend registered with ``torch.distributed.Backend.register_backend``)."""
    accepted: list[str] = []
    for part in backend.split(","):
        device, _, name = part.rpartition(":")
        if device:
            accepted.append(device)
        else:
            accepted += dist.Backend.backend_capability.get(name.lower(), ["cpu", "cuda"])
    return accepted


def collective_device(model_device: str | torch.device = "cpu", backend: str | None = None) -> torch.device:
    """The device for the tensors of this process's collectives (``backend``: the default group's).

    The model's device when the group's backend takes its tensors (NCCL and CUDA; gloo and the CPU), else the
    CPU when the backend takes CPU tensors, else the first device type the backend was registered for."""
    accepted = accepted_devices(str(dist.get_backend()) if backend is None else backend)
    model = torch.device(model_device)
    if model.type in accepted:
        return model
    return torch.device("cpu" if "cpu" in accepted else accepted[0])


class _EveryWeightGetsAGradient(torch.autograd.Function):
    """Identity on ``out`` whose backward also gives each of ``weights`` a zero gradient. Autograd adds it to
    the weight's real gradient where the weight was used (g + 0 == g, bit for bit) and makes it the gradient
    where it was not, so no parameter of the FSDP unit is left with ``grad is None``."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        ctx.specs = [(w.shape, w.dtype, w.device) for w in weights]
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        zeros = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.specs]
        return (grad, *zeros)


def _touch_every_expert(module: torch.nn.Module, args, out: torch.Tensor) -> torch.Tensor:
    """Forward hook of a ``SparseMoE``: its output, tied to every expert weight by
    ``_EveryWeightGetsAGradient``."""
    if not torch.is_grad_enabled():
        return out
    weights = [p for p in module.experts.parameters() if p.requires_grad]
    return _EveryWeightGetsAGradient.apply(out, *weights) if weights else out


def reduce_scatter_unused_params(model: torch.nn.Module) -> str:
    """Make every rank reduce-scatter the same parameters of each FSDP unit, whichever experts its tokens
    reached. Returns how: ``"fsdp"`` or ``"zero_grads"``.

    FSDP2 reduce-scatters, per unit, the parameters whose gradient is not None. An MoE expert that no token of
    this rank reached (the CPU op set's MoE runs only the experts that have rows) has none, so the ranks would
    send different sets of gradients: mismatched collectives (an error with gloo, a hang or garbage with
    NCCL).

    torch >= 2.13 has ``FSDPModule.set_reduce_scatter_unused_params``: FSDP itself then sends zeros for them
    (``"fsdp"``). Older torch (2.11 on the H200 machine) lacks it: every ``SparseMoE`` then gets a forward
    hook that ties its output to all its expert weights, whose backward gives each expert a zero gradient that
    adds to the real one (``"zero_grads"``; the forward's bits are unchanged: the hook returns a view of the
    output). Either way an unreached expert's gradient is zeros, as the Triton MoE gives it anyway.
    """
    from torch.distributed.fsdp import FSDPModule

    from rz_agents.model.transformer import SparseMoE

    if hasattr(FSDPModule, "set_reduce_scatter_unused_params"):
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_reduce_scatter_unused_params(True, recurse=False)
        return "fsdp"
    for module in model.modules():
        if isinstance(module, SparseMoE):
            module.register_forward_hook(_touch_every_expert)
    return "zero_grads"


class SingleProcess:
    """The one-process learner: every micro-batch runs here and there is nothing to exchange."""

    rank = 0
    world = 1
    # Whether ``shard`` leaves the parameters as fp32 shards that are themselves the master weights (a
    # low-precision model then needs no separate fp32 copies: ``trainer/master_weights.py``). Here: the
    # parameters stay in the model's dtype.
    keeps_fp32_shards = False
    # Whether the trained parameters are sharded (FSDP2 without LoRA): their fp32 shards are then the masters
    # and their gradients are reduce-scattered. False: they are whole here (one process; LoRA adapters
    # replicated on every rank, whose gradients trainer/replicated_grads.py exchanges).
    shards_trained = False

    def shard(self, model: torch.nn.Module) -> torch.nn.Module:
        """Prepare ``model`` for training on these ranks (here: as it is)."""
        return model

    def share(self, num_micro_batches: int) -> list[int | None]:
        """Indices of the micro-batches this rank runs (None: an idle pass that keeps ranks in step)."""
        return list(range(num_micro_batches))

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of ``tensor`` over the ranks, on ``tensor``'s device (one collective)."""
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` stacked in rank order (``[world, *tensor.shape]``; here ``tensor[None]``),
        on ``tensor``'s device: copies, no arithmetic."""
        return tensor[None]

    def full(self, tensor: torch.Tensor) -> torch.Tensor:
        """The whole tensor of a (possibly sharded) parameter, gradient or optimizer state."""
        return tensor

    def shard_like(self, full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``full`` cut the way ``like`` is sharded (here: unchanged)."""
        return full


class ShardedRanks(SingleProcess):
    """One rank of a learner whose model FSDP2 shards over the default torch.distributed group.

    Call after ``torch.distributed.init_process_group`` (gloo on CPU, NCCL on GPU), with the same model
    (same weights) on every rank; ``shard`` then keeps 1/world of each parameter here, in fp32.
    """

    # the fp32 shards are the masters; the forward computes in the model's dtype (with LoRA the sharded base
    # stays in the model's dtype and the whole adapters have fp32 copies: ``shards_trained`` False)
    keeps_fp32_shards = True

    def __init__(self, device: str = "cpu") -> None:
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            raise RuntimeError("ShardedRanks needs torch.distributed.init_process_group first")
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.device = device
        self.comm_device = collective_device(device)
        self.mesh = init_device_mesh(device, (self.world,))
        self.shards_trained = True  # (until ``shard`` meets a LoRA model: its adapters stay whole)

    def shard(self, model: torch.nn.Module) -> torch.nn.Module:
        """Shard ``model`` in place: each decoder layer is one FSDP2 unit, the root holds the embeddings,
        final norm and LM head (tied embeddings stay one parameter). The sharded parameters are fp32 (the
        master weights); the forward computes in the model's own dtype. A model on the meta device gets
        storage for this rank's shards only, uninitialised: load its weights next (``Learner.replace_weights``
        with a ``LazyState`` reads one whole tensor at a time)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

        from rz_kernels.gemm import set_packed_cache

        # FSDP2 refills the unsharded parameters without bumping their version counters: no packed-weight
        # cache in this process (the aligned GEMM packs per call; results are the same bits)
        set_packed_cache(False)
        compute = next(model.parameters()).dtype
        on_meta = next(model.parameters()).is_meta
        # LoRA: the adapters stay whole here (replicated), the base is sharded in the model's dtype (frozen:
        # it has no master, and fp32 shards would only double its memory)
        adapters = [p for n, p in model.named_parameters() if ".lora_A." in n or ".lora_B." in n]
        if adapters and on_meta:
            raise ValueError("LoRA on sharded ranks needs the model built whole, not on the meta device")
        self.shards_trained = not adapters
        # (what keeps_fp32_shards states). A model on the meta device (``model_skeleton``) is cast there, for
        # free, and only this rank's shards are allocated below: no rank ever holds the whole model.
        dtype = torch.float32 if self.shards_trained else compute
        model.to(dtype=dtype) if on_meta else model.to(device=self.device, dtype=dtype)
        policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
        ignored = set(adapters) or None
        # the decoder's layers: a vision-language model keeps them under its language model
        stack = model.decoder if hasattr(model, "decoder") else model.model
        for layer in stack.layers:
            fully_shard(layer, mesh=self.mesh, mp_policy=policy, ignored_params=ignored)
        fully_shard(model, mesh=self.mesh, mp_policy=policy, ignored_params=ignored)
        if on_meta:  # storage for the local shards only (tied embeddings stay tied); the caller loads them
            model.to_empty(device=self.device)
        # The LM head runs in Transformer.logits, outside forward: FSDP must see that call too. So must it see
        # packed_inputs (every family has it): a vision-language model encodes its images there, with the
        # root unit's vision tower, before forward (unseen, the tower's weights would still be shards).
        register_fsdp_forward_method(model, "logits")
        register_fsdp_forward_method(model, "packed_inputs")
        for module in model.modules():
            if hasattr(module, "set_gradient_divide_factor"):
                module.set_gradient_divide_factor(1.0)  # sum over ranks: the loss is normalised globally
                module.set_force_sum_reduction_for_comms(True)  # gloo has no AVG / PREMUL_SUM
        # MoE experts that no token of this rank reached must still join the reduce-scatter.
        reduce_scatter_unused_params(model)
        return model

    def share(self, num_micro_batches: int) -> list[int | None]:
        mine: list[int | None] = list(range(self.rank, num_micro_batches, self.world))
        per_rank = math.ceil(num_micro_batches / self.world)
        return mine + [None] * (per_rank - len(mine))

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        t = tensor.to(self.comm_device, copy=True)  # (a copy: the caller's tensor stays as it was)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.to(tensor.device)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        t = tensor.to(self.comm_device).contiguous().reshape(-1)
        out = torch.empty(self.world * t.numel(), dtype=t.dtype, device=t.device)  # (gloo: flat only)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # (renamed in 2.13)
        gather(out, t)
        return out.view(self.world, *tensor.shape).to(tensor.device)

    def full(self, tensor: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor

    def shard_like(self, full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, distribute_tensor

        if not isinstance(like, DTensor):
            return full.to(like.dtype)
        # Every rank holds the same full tensor: each keeps its own chunk, nothing is sent.
        full = full.to(device=like.device, dtype=like.dtype)
        return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
