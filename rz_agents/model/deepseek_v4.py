"""DeepSeek-V4 (sliding + compressed sparse + heavily compressed attention, hyper-connections, hash-routed and
learned-routed MoE) on rz's op set: the learner's packed forward and HF checkpoint load / save.

The forward takes the forward contract's packed stream (tokens, positions, sequence ids; every sequence from
position 0, as the learner packs them) and returns the final hidden states; `logits` applies the LM head.
Each token enters as `hc_mult` copies of its embedding (the residual streams); every layer collapses them
into the attention's / the MoE's input and mixes the block's output back in (model/deepseek_v4_layers.py); a
hyper head collapses them before the final norm. Attention is model/deepseek_v4_attention.py, the MoE
model/deepseek_v4_moe.py.

Parameter names are the ones transformers writes for DeepseekV4ForCausalLM (DeepSeek's own names under
`model.`, the LM head as `head.weight`), so a checkpoint loads and saves by name. DeepSeek's released
checkpoints ship FP8 (and FP4 expert) weights with scale tensors: those are refused with one line (dequantize
to bf16 first); their other naming differences (no `model.` prefix, `embed.weight`, `hc_head_fn`) are mapped.
Cached inference: standalone (`SequenceState`: per sequence and layer, the rows later tokens still read and
the pooled entries; chunked prefill and decode give the packed forward's bits), or in the engine's pages
(`new_kv_cache`, a `kv_cache` view: model/deepseek_v4_cache.py reads each sequence's state from its pages,
runs the standalone path and writes the new state back).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from rz_agents.model.deepseek_v4_attention import Attention, Layout, Reach, SequenceState, rope_pair
from rz_agents.model.deepseek_v4_cache import DeepseekV4Cache, paged_forward, v4_bytes_per_page
from rz_agents.model.deepseek_v4_config import DeepseekV4Config
from rz_agents.model.deepseek_v4_decode import PagedDecode
from rz_agents.model.deepseek_v4_layers import hyper_head, hyper_merge, hyper_mix
from rz_agents.model.deepseek_v4_moe import MoE
from rz_agents.model.forward_inputs import Segment, refuse_images
from rz_agents.model.layers import RMSNorm, _linear
from rz_kernels import OpSet, get_ops


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DeepseekV4Config, index: int) -> None:
        super().__init__()
        n, hidden = cfg.hc_mult, cfg.hidden_size
        mix = (2 + n) * n
        self.attn = Attention(cfg, index)
        self.ffn = MoE(cfg, index)
        self.attn_norm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.ffn_norm = RMSNorm(hidden, cfg.rms_norm_eps)
        for site in ("attn", "ffn"):
            self.register_parameter(f"hc_{site}_fn", nn.Parameter(torch.zeros(mix, n * hidden)))
            self.register_parameter(f"hc_{site}_base", nn.Parameter(torch.zeros(mix)))
            self.register_parameter(f"hc_{site}_scale", nn.Parameter(torch.ones(3)))
        self.hc = (cfg.rms_norm_eps, cfg.hc_eps, cfg.hc_sinkhorn_iters)

    def forward(self, streams: torch.Tensor, tokens: torch.Tensor, fwd: _Forward) -> torch.Tensor:
        ops = fwd.ops
        post, comb, x = hyper_mix(
            streams, self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale, ops, *self.hc
        )
        out = self.attn(self.attn_norm(x, ops), fwd.layout, fwd.ropes, ops, fwd.trace)
        streams = hyper_merge(streams, out, post, comb)
        post, comb, x = hyper_mix(streams, self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale, ops, *self.hc)
        out = self.ffn(self.ffn_norm(x, ops), tokens, ops, fwd.trace)
        return hyper_merge(streams, out, post, comb)


class HyperHead(nn.Module):
    def __init__(self, cfg: DeepseekV4Config) -> None:
        super().__init__()
        n = cfg.hc_mult
        self.hc_fn = nn.Parameter(torch.zeros(n, n * cfg.hidden_size))
        self.hc_base = nn.Parameter(torch.zeros(n))
        self.hc_scale = nn.Parameter(torch.ones(1))
        self.eps = (cfg.rms_norm_eps, cfg.hc_eps)

    def forward(self, streams: torch.Tensor, ops: OpSet) -> torch.Tensor:
        return hyper_head(streams, self.hc_fn, self.hc_base, self.hc_scale, ops, *self.eps)


class _Stack(nn.Module):
    def __init__(self, cfg: DeepseekV4Config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hc_head = HyperHead(cfg)


class _Forward:
    """What every layer of one forward shares: op set, token layout (a packed stream's ``Layout``, or a decode
    step's ``PagedDecode`` over the engine's pages), rotations, and the selection trace."""

    def __init__(
        self, model: DeepseekV4ForCausalLM, positions: torch.Tensor, layout: Layout | PagedDecode, trace
    ) -> None:
        self.ops = model.ops_for(positions.device)
        self.layout = layout
        self.ropes = model.ropes
        for kind, rope in self.ropes.items():
            layout.angles[kind] = rope.angles(positions)
        self.trace = trace


def _check_rope(rope: torch.Tensor | None, positions: torch.Tensor) -> None:
    """Refuse RoPE rows other than the positions (this model rotates by its positions)."""
    if rope is not None and not torch.equal(rope.reshape(-1), positions.reshape(-1)):
        raise ValueError("DeepseekV4ForCausalLM rotates by its positions: text_rope_positions differ")


class DeepseekV4ForCausalLM(nn.Module):
    """DeepSeek-V4 causal LM: `forward` gives final hidden states [T, hidden], `logits` the fp32 LM head."""

    supports_cache = True  # the engine's paged cache: model/deepseek_v4_cache.py
    takes_images = False

    def __init__(self, config: DeepseekV4Config, kernels: str = "aligned", init: bool = True) -> None:
        super().__init__()
        get_ops(kernels)  # an unknown name fails here
        self.config, self.kernels = config, kernels
        self.model = _Stack(config)
        self.head = _linear(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.head.weight = self.model.embed_tokens.weight
        self.ropes = rope_pair(config)
        self.selection_trace: list | None = None  # tests set a list: each forward appends its selections
        if init:
            self.reset_parameters()
        self.to(config.torch_dtype)

    @torch.no_grad()
    def randomize_biases(self, seed: int, scale: float = 0.5, router_scale: float = 0.1) -> None:
        """What ``reset_parameters`` leaves at zero, drawn at random: the attention sinks, the compressors'
        position biases and the hyper-connection bases N(0, scale), the routers' selection biases
        N(0, router_scale): a tiny random model whose attention and routing are not flat (tests, checks)."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith(("attn_sink", ".ape", "_base")):
                p.copy_(torch.randn(p.shape, generator=gen).to(p.dtype) * scale)
        for name, b in self.named_buffers():
            if name.endswith("gate.bias"):
                b.copy_(torch.randn(b.shape, generator=gen).to(b.dtype) * router_scale)

    @property
    def lm_head(self) -> nn.Linear:
        """The LM head (stored as `head.weight`, the checkpoint's name)."""
        return self.head

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def ops_for(self, device: torch.device | str) -> OpSet:
        return get_ops(self.kernels, device)

    @property
    def ops(self) -> OpSet:
        return self.ops_for(self.device)

    def set_kernels(self, kernels: str) -> None:
        """Switch op set in place (same weights)."""
        get_ops(kernels)
        self.kernels = kernels

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, seed: int | None = None) -> None:
        """A random model: matrices N(0, std), norms 1, position biases / sinks / hc bases 0, hc scales 1,
        each hash table a random choice of distinct experts per token."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or name.endswith("_scale") or name.endswith("hc_scale"):
                p.fill_(1.0)
            elif p.dim() >= 2 and not name.endswith(".ape"):
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            else:
                p.zero_()
        cfg = self.config
        for name, b in self.named_buffers():
            if name.endswith("tid2eid"):
                rows = [
                    torch.randperm(cfg.n_routed_experts, generator=gen)[: b.shape[1]]
                    for _ in range(b.shape[0])
                ]
                b.copy_(torch.stack(rows))

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        seq_ids: torch.Tensor | None = None,
        kv_cache=None,
        max_position: int | None = None,
        num_sequences: int | None = None,
        states: Sequence[SequenceState] | None = None,
        **extra,
    ) -> torch.Tensor:
        """Final hidden states [T, hidden] of a packed stream (tokens, positions, seq_ids [T]; or [B, S] rows,
        each a sequence). Without ``states`` every sequence starts at position 0 in this call (the learner's
        packed forward). With them (standalone cached inference: a prefill chunk or decode tokens), sequence
        ``seq_ids == i`` continues ``states[i]`` from its position, and the states are updated in place. The
        engine passes a ``kv_cache`` view of ``new_kv_cache``'s pages instead (each table row a sequence
        continuing from its pages: a prefill chunk or a decode token)."""
        rope = extra.pop("text_rope_positions", None)  # (the engine's decode step passes the RoPE rows)
        if any(v is not None for v in extra.values()):
            raise ValueError(
                f"DeepseekV4ForCausalLM takes no {sorted(k for k, v in extra.items() if v is not None)}"
            )
        if kv_cache is not None:
            if states is not None or seq_ids is None:
                raise ValueError("a kv_cache forward takes seq_ids (rows of its page table) and no states")
            # a decode step's RoPE rows are its positions for a model without images: not read back to check
            if kv_cache.decode_positions is None:
                _check_rope(rope, positions)
            return paged_forward(self, tokens, positions, seq_ids, kv_cache)
        _check_rope(rope, positions)
        shape = tokens.shape
        tokens, positions = tokens.reshape(-1), positions.reshape(-1)
        if seq_ids is None:
            seq_ids = (
                torch.arange(shape[0], device=tokens.device).view(-1, 1).expand(shape).reshape(-1)
                if len(shape) == 2
                else torch.cumsum((positions == 0).long(), 0) - 1
            )
        seq_ids = seq_ids.reshape(-1)
        if states is not None:
            states = list(states)
            num_sequences = len(states)
            counts = torch.bincount(seq_ids.cpu(), minlength=num_sequences).tolist()
            expected = torch.cat(
                [torch.arange(st.position, st.position + n) for st, n in zip(states, counts, strict=True)]
            )
            if not torch.equal(positions.cpu()[torch.argsort(seq_ids.cpu(), stable=True)], expected):
                raise ValueError("with states, sequence i's tokens must continue states[i] at its position")
        elif num_sequences is None:
            _, seq_ids = torch.unique(seq_ids, return_inverse=True)
            num_sequences = int(seq_ids.max()) + 1 if seq_ids.numel() else 0
        top = max_position if max_position is not None else (int(positions.max()) if positions.numel() else 0)
        cfg = self.config
        reach = Reach(cfg.sliding_window, cfg.csa_rate, cfg.hca_rate)
        layout = Layout(positions, seq_ids, num_sequences, top, states, reach)
        fwd = _Forward(self, positions, layout, self.selection_trace)
        hidden = self._layers(tokens, fwd)
        for s, (st, n) in enumerate(zip(states or [], counts if states is not None else [], strict=True)):
            st.position += n
            st.start = fwd.layout.keep_from[s]
        return hidden if len(shape) == 1 else hidden.view(*shape, -1)

    def paged_decode(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: DeepseekV4Cache,
        table: torch.Tensor,
        bound: int,
    ) -> torch.Tensor:
        """The engine's decode step: token i at positions[i] continues the sequence whose pages are table row
        i, read and written in place in shapes fixed by (batch, ``bound``), no host read
        (model/deepseek_v4_decode.py: what a CUDA graph captures). Final hidden states [B, hidden]."""
        step = PagedDecode(cache, table, positions, bound)
        return self._layers(tokens, _Forward(self, positions, step, self.selection_trace))

    def _layers(self, tokens: torch.Tensor, fwd: _Forward) -> torch.Tensor:
        """Embedding, every layer and the hyper head: the final hidden states [T, hidden]."""
        x = self.model.embed_tokens(tokens)
        streams = x.unsqueeze(1).expand(-1, self.config.hc_mult, -1).contiguous()
        recompute = self.config.activation_checkpointing and torch.is_grad_enabled()
        for layer in self.model.layers:
            streams = (
                checkpoint(layer, streams, tokens, fwd, use_reentrant=False)
                if recompute
                else layer(streams, tokens, fwd)
            )
        return self.model.norm(self.model.hc_head(streams, fwd.ops), fwd.ops)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head in the op set's GEMM, as fp32 [..., vocab]."""
        return self.ops_for(hidden.device).linear(hidden, self.head.weight).float()

    # ---- the engine's cache -----------------------------------------------------------------------------
    def kv_page_bytes(self) -> int:
        """Bytes of one cache page (64 positions, every layer: rows and compressed entries)."""
        return v4_bytes_per_page(self.config, self.head.weight.dtype)

    def new_kv_cache(self, num_pages: int, device: torch.device | str) -> DeepseekV4Cache:
        """The engine's paged cache of this model (model/deepseek_v4_cache.py)."""
        return DeepseekV4Cache(self.config, num_pages, dtype=self.head.weight.dtype, device=device)

    # ---- the forward contract's other questions (a text model: no images) ----------------------------------
    def scored_sequence(self, tokens: list[int], images, loss_mask) -> object:
        if images:
            raise ValueError("trajectories carry images but DeepSeek-V4 is a text model")
        return tokens

    def packed_inputs(self, sequences: Sequence, ids: list[torch.Tensor]) -> dict:
        return {}

    def extra_inputs(self, segments: list[Segment]) -> dict:
        """Transformer.extra_inputs: none (a text model)."""
        return refuse_images(type(self).__name__, segments)

    def token_names(self) -> dict[int, str]:
        return {}

    def hf_config(self) -> dict:
        """This model's config.json (`save_hf_checkpoint` writes it, DeepseekV4Config reads it)."""
        return {**self.config.to_hf(), "dtype": str(self.head.weight.dtype).removeprefix("torch.")}

    def num_parameters(self) -> int:
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())


# ---- checkpoints -------------------------------------------------------------------------------------------
_RELEASED_TOP = {
    "embed.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
}


def checkpoint_name(name: str) -> str:
    """A tensor's name in rz (= what transformers writes) from either that name or DeepSeek's release's."""
    if name in _RELEASED_TOP:
        return _RELEASED_TOP[name]
    if name.startswith("layers."):
        return "model." + name
    return name


def _refuse_quantized(name: str, tensor: torch.Tensor, where: os.PathLike | str) -> None:
    quantized = tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) or name.endswith(
        ("_scale_inv", ".scale")
    )
    if quantized or (tensor.dtype == torch.int8 and ".experts." in name):
        raise ValueError(
            f"{where}: {name} is FP8/FP4-quantized ({tensor.dtype}); rz loads bf16/fp32 DeepSeek-V4 weights "
            "only: dequantize the checkpoint first"
        )


def load_deepseek_v4(
    ckpt_dir: str | os.PathLike,
    kernels: str = "aligned",
    dtype: str | None = None,
    device: torch.device | str = "cpu",
) -> DeepseekV4ForCausalLM:
    """A DeepSeek-V4 model from a checkpoint directory (config.json + safetensors), every tensor by name; a
    missing or unexpected tensor is an error naming it; multi-token-prediction tensors (`mtp.*`) are skipped
    as transformers skips them; FP8/FP4 weights are refused (one line)."""
    from rz_agents.model.safetensors_dir import copy_by_name, load_state

    config = DeepseekV4Config.from_checkpoint(ckpt_dir, dtype=dtype)
    with torch.device("meta"):
        model = DeepseekV4ForCausalLM(config, kernels, init=False)
    model.to_empty(device=device)
    if config.tie_word_embeddings:
        model.head.weight = model.model.embed_tokens.weight
    state = {}
    for name, tensor in load_state(ckpt_dir).items():
        if name.startswith(("mtp.", "model.mtp.")):
            continue
        _refuse_quantized(name, tensor, ckpt_dir)
        state[checkpoint_name(name)] = tensor
    expected = model.state_dict()
    if config.tie_word_embeddings:
        state.pop("head.weight", None)
        expected.pop("head.weight", None)
    copy_by_name(expected, state, set(expected), ckpt_dir, "deepseek_v4")
    return model


def is_deepseek_v4(ckpt_dir: str | os.PathLike) -> bool:
    """Whether `ckpt_dir`'s config.json is a DeepSeek-V4 one."""
    import json

    path = Path(ckpt_dir) / "config.json"
    return path.is_file() and json.loads(path.read_text()).get("model_type") == "deepseek_v4"
