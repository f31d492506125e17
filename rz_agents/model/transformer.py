"""Llama / Qwen2 / Qwen3 / Qwen3-MoE (and DeepSeek-V3: model/mla.py, model/deepseek_moe.py) decoder in
plain PyTorch, on a switchable op set.

One model code serves the rollout engine (cached inference) and the trainer (packed forward).
Tokens travel as one flat stream with absolute positions and a sequence id per token; attention
reads keys/values from a buffer addressed by (sequence, position): a temporary one built from the
batch itself in training, the engine's paged KVCache (through a CacheView of page tables) in
inference. With `kernels="aligned"` both paths
run the same arithmetic per token, so their log-probs agree bitwise.

Parameter names are the HF checkpoint names (model.layers.N.self_attn.q_proj.weight, ...), so
checkpoints and weight updates are copies by name. `fuse_projections` (the engine calls it) stacks q/k/v and
gate/up into one weight each, the parameters becoming views of it (names unchanged, see model/fused.py); the
cached-inference forwards then run one GEMM for each, with the same bits as the separate ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from rz_agents.model.config import ModelConfig
from rz_agents.model.deepseek_moe import DeepseekMoE
from rz_agents.model.forward_inputs import Segment, refuse_images
from rz_agents.model.fused import FusedLinears, project
from rz_agents.model.kv_cache import PAGE_SIZE, CacheView, KVCache, bytes_per_page
from rz_agents.model.layers import MLP, RMSNorm, _linear  # noqa: F401 (their public home was this file)
from rz_agents.model.lora_math import linear as adapted_linear
from rz_agents.model.mla import LatentAttention
from rz_agents.model.mrope import ImagePositions
from rz_agents.model.rope_scaling import rope_table
from rz_agents.model.vision import ImageEmbeddings, VLSequence
from rz_kernels import OpSet, get_ops
from rz_kernels.attention import KEY_BLOCK, verify_attention
from rz_kernels.gemm import verify_weights


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        d = cfg.head_dim
        self.q_proj = _linear(cfg.hidden_size, self.num_heads * d, cfg.qkv_bias)
        self.k_proj = _linear(cfg.hidden_size, self.num_kv_heads * d, cfg.qkv_bias)
        self.v_proj = _linear(cfg.hidden_size, self.num_kv_heads * d, cfg.qkv_bias)
        self.o_proj = _linear(self.num_heads * d, cfg.hidden_size, False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm
        self.qkv: FusedLinears | None = None  # set by Transformer.fuse_projections

    def forward(self, x: torch.Tensor, ctx: _Context, layer: int) -> torch.Tensor:
        ops = ctx.ops
        t = x.shape[0]
        q, k, v = project(self.qkv, (self.q_proj, self.k_proj, self.v_proj), x, ops, ctx.fused)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q = self.q_norm(q, ops)
            k = self.k_norm(k, ops)
        q = ops.rope(ctx.rope, q, ctx.rope_positions)
        k = ops.rope(ctx.rope, k, ctx.rope_positions)
        k_buf, v_buf = ctx.store(layer, k, v)
        out = ops.attention(q, k_buf, v_buf, ctx.attention_plan, 1.0 / math.sqrt(self.head_dim))
        return adapted_linear(self.o_proj, out.reshape(t, -1), ops)  # (+ its LoRA adapter: model/lora.py)


class SparseMoE(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.normalize = cfg.norm_topk_prob
        self.num_experts = cfg.num_experts
        self.gate = _linear(cfg.hidden_size, cfg.num_experts)
        self.experts = nn.ModuleList(
            MLP(cfg.hidden_size, cfg.moe_intermediate_size) for _ in range(cfg.num_experts)
        )

    def forward(self, x: torch.Tensor, ctx: _Context) -> torch.Tensor:
        ops = ctx.ops
        weights, experts = ops.route(ops.linear(x, self.gate.weight), self.top_k, self.normalize)
        expert_weights = tuple(
            [getattr(mlp, name).weight for mlp in self.experts]
            for name in ("gate_proj", "up_proj", "down_proj")
        )
        return ops.moe(
            x,
            weights,
            experts,
            self.num_experts,
            lambda e, xe: self.experts[e].run(xe, ops, ctx.fused),
            expert_weights=expert_weights,
        )


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        self.index = index
        # MLA + DeepSeek MoE live in their own files (built from model/layers.py, as this one)
        if cfg.model_type == "deepseek_v3":
            attn, moe = LatentAttention, DeepseekMoE
        else:
            attn, moe = Attention, SparseMoE
        # Registration order = parameter order (optimizer, gradient-norm sums, checkpoints): keep it the HF
        # order, input norm, attention, post-attention norm, MLP.
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = attn(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = moe(cfg) if cfg.is_moe_layer(index) else MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, ctx: _Context) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x, ctx.ops), ctx, self.index)
        return x + self.mlp(self.post_attention_layernorm(x, ctx.ops), ctx)


class DecoderStack(nn.Module):
    """The HF `model.` prefix: embeddings, layers, final norm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class _Context:
    """Per-forward state shared by the layers: op set, positions, and where K/V live."""

    def __init__(
        self,
        model: Transformer,
        positions,
        seq_ids,
        kv_cache: CacheView | None,
        max_position: int | None = None,
        num_sequences: int | None = None,
    ) -> None:
        self.ops = model.ops_for(positions.device)
        self.positions = positions
        self.kv_cache = kv_cache
        # Stacked q/k/v and gate/up GEMMs (where fuse_projections made them) on the cached-inference path
        # only: the trainer's packed forward keeps the separate GEMMs (same bits, and its gradients reach
        # them).
        self.fused = model.fused_projections and kv_cache is not None and not torch.is_grad_enabled()
        cfg = model.config
        page_table = None
        decode = kv_cache.decode_positions if isinstance(kv_cache, CacheView) else None
        # The highest position, read once per forward: the engine passes it with its cache view and the
        # learner's packed forward as ``max_position`` (no sync); other callers pay one host sync here, and no
        # layer pays one again (the RoPE view is prechecked).
        top = kv_cache.max_position if isinstance(kv_cache, CacheView) else max_position
        if top is None and positions.numel():
            top = int(positions.max())
        if kv_cache is not None:
            if not isinstance(kv_cache, CacheView):
                raise TypeError(
                    f"kv_cache must be a CacheView (KVCache.view(page_table)), got {type(kv_cache).__name__}"
                )
            if top is not None and top >= kv_cache.capacity:
                raise ValueError(f"position {top} exceeds the page table's {kv_cache.capacity} positions")
            self.buf_seq = seq_ids
            page_table = kv_cache.page_table
            # flat cache row of each token: page * 64 + offset (computed on the device, no sync)
            pages = page_table[seq_ids, torch.div(positions, PAGE_SIZE, rounding_mode="floor")]
            self.write_page, self.write_offset = pages, positions % PAGE_SIZE
        else:
            if num_sequences is not None:  # ids already 0..num_sequences-1 (the packed forward's): no sync
                self.buf_seq, rows = seq_ids, num_sequences
            else:  # any ids, compacted: torch.unique reads its count back to the host (a sync on a GPU)
                uniq, self.buf_seq = torch.unique(seq_ids, return_inverse=True)
                rows = uniq.numel()
            span = -(-(top + 1) // KEY_BLOCK) * KEY_BLOCK if top is not None else KEY_BLOCK
            self.buf_shape = (rows, cfg.num_key_value_heads, span, cfg.head_dim)
        model.rope.check_top(top)
        self.rope = model.rope.prechecked()
        # the rows of `rope` each token rotates by: its position here; a multimodal model (model/qwen3_vl.py)
        # swaps in per-token rows of its 3D positions, attention still ordered by `positions`
        self.rope_positions = positions
        self.attention_plan = self.ops.plan_attention(
            self.buf_seq,
            positions,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            page_table=page_table,
            max_position=top,
            decode_positions=decode,
        )

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kv_cache is not None:
            cache = self.kv_cache.cache
            k_buf, v_buf = cache.k[layer], cache.v[layer]
            with torch.no_grad():
                k_buf[self.write_page, :, self.write_offset] = k.detach()
                v_buf[self.write_page, :, self.write_offset] = v.detach()
            return k_buf, v_buf
        k_buf = torch.zeros(self.buf_shape, dtype=k.dtype, device=k.device)
        v_buf = torch.zeros(self.buf_shape, dtype=v.dtype, device=v.device)
        k_buf[self.buf_seq, :, self.positions] = k
        v_buf[self.buf_seq, :, self.positions] = v
        return k_buf, v_buf


def flat_stream(
    tokens: torch.Tensor, positions: torch.Tensor, seq_ids: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens, positions, seq_ids), each [T], of a flat stream [T] or a padded batch [B, S] (each row one
    sequence). ``seq_ids`` None: a new sequence starts wherever positions == 0 (a [B, S] batch: per row)."""
    shape = tokens.shape
    if positions.shape != shape:
        raise ValueError(f"positions {tuple(positions.shape)} must match tokens {tuple(shape)}")
    if tokens.dim() == 2:
        if seq_ids is None:
            seq_ids = torch.arange(shape[0], device=tokens.device).view(-1, 1).expand(shape)
        return tokens.reshape(-1), positions.reshape(-1), seq_ids.reshape(-1)
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be [T] or [B, S], got {tuple(shape)}")
    if seq_ids is None:
        if tokens.numel() and int(positions[0]) != 0:
            raise ValueError("without seq_ids the stream must start a sequence at position 0")
        seq_ids = torch.cumsum((positions == 0).long(), 0) - 1
    return tokens, positions, seq_ids


def in_token_shape(hidden: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Hidden states [T, hidden] of a flat stream back in the tokens' ``shape`` ([T] or [B, S]). A flat
    stream's are returned as they are, not as a view: FSDP2 warns on every forward of a sharded root whose
    output is a view (the data are the same either way)."""
    return hidden if len(shape) == 1 else hidden.view(*shape, -1)


class Transformer(nn.Module):
    """Causal LM. `forward` returns final hidden states; `logits` applies the LM head in fp32."""

    def __init__(
        self, config: ModelConfig, kernels: str = "aligned", init: bool = True, stack: nn.Module | None = None
    ) -> None:
        """``stack``: the layers below the LM head (None: a ``DecoderStack`` of ``config``; Qwen3VLModel
        passes its vision tower + language model)."""
        super().__init__()
        self.config = config
        get_ops(kernels)  # reject an unknown name now
        self.kernels = kernels
        self.model = DecoderStack(config) if stack is None else stack
        self.lm_head = _linear(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.get_input_embeddings().weight
        self.rope = rope_table(config)  # default or YaRN frequencies over config.rope_dim
        self.fused_projections = False
        if init:  # init=False leaves parameters for the caller to fill (checkpoint loading)
            self.reset_parameters()
        self.to(config.torch_dtype)

    def set_kernels(self, kernels: str) -> None:
        """Switch op set in place (same weights)."""
        get_ops(kernels)
        self.kernels = kernels

    def fuse_projections(self, enabled: bool = True) -> None:
        """Stack each layer's q/k/v and gate/up weights into one tensor (the parameters become views of it).

        Cached-inference forwards (a kv_cache, no grad: the engine) then compute each group with one GEMM;
        the packed training forward keeps one GEMM per weight. Names, shapes and identities of the
        parameters are unchanged (see model/fused.py). ``enabled=False`` only stops using the stacked GEMMs
        (the parameters stay views of the stacked tensors: dropping those would free nothing). Stacks that
        are still current are kept; re-done after ``Module.to``; safe to call again.
        """
        self.fused_projections = enabled
        if not enabled:
            return
        for m in self.modules():
            if isinstance(m, Attention) and (m.qkv is None or not m.qkv.current()):
                m.qkv = FusedLinears((m.q_proj, m.k_proj, m.v_proj))
            elif isinstance(m, MLP) and (m.gate_up is None or not m.gate_up.current()):
                m.gate_up = FusedLinears((m.gate_proj, m.up_proj))

    def _apply(self, fn, recurse: bool = True):
        # .to() / .half() give the parameters new storage: stack them again (else they would run unfused).
        out = super()._apply(fn, recurse)
        if getattr(self, "fused_projections", False):
            self.fuse_projections()
        return out

    def verify_kernels(self) -> None:
        """Run the aligned CPU kernels' start-up guards for this model's shapes at the current thread count.

        Every GEMM weight shape is checked at every row bucket, and attention at every tile size
        (see rz_kernels.gemm / rz_kernels.attention); shapes that fail fall back to the tiled forms,
        logged. Checks are cached per process, so this costs once; without it they run on first use.
        """
        if self.kernels != "aligned" or self.device.type != "cpu":
            return
        verify_weights(m.weight for m in self.modules() if isinstance(m, nn.Linear))
        for m in self.modules():
            for fused in (getattr(m, "qkv", None), getattr(m, "gate_up", None)):
                if isinstance(fused, FusedLinears):  # (a vision block's `qkv` is a plain nn.Linear)
                    fused.usable(self.ops)  # the stacked shape's guard and the fusion check
        cfg = self.config
        verify_attention(cfg.num_attention_heads // cfg.num_key_value_heads, cfg.head_dim)

    def hf_config(self) -> dict:
        """The HF config.json dict of this model (checkpoint saving)."""
        return self.config.to_hf()

    # ---- the forward contract's image inputs -----------------------------------------------------------
    # ``forward`` takes tokens, positions, seq ids and a cache, plus optional ``rope_positions`` and image
    # inputs (``images``, ``image_slots``). Only a model that takes images (Qwen3VLModel) accepts the
    # latter; it says so here and answers what its callers need of them, so the engine and the learner ask
    # the model, never its config.
    takes_images = False

    def image_positions(self, prompt: list[int], grids: torch.Tensor) -> ImagePositions:
        """Where ``prompt``'s image placeholders are and how its tokens rotate (images with ``grids``).
        A text model has no images: ValueError."""
        raise ValueError("images need a vision-language model (Qwen3-VL); this model has none")

    def image_row_bytes(self) -> int:
        """Bytes of one image placeholder's encoding (0: a model without a vision tower)."""
        return 0

    def token_names(self) -> dict[int, str]:
        """Names for ids this model gives a meaning a tokenizer may not know (empty for a text model)."""
        return {}

    def scored_sequence(self, tokens: list[int], images: list[bytes] | None, loss_mask: list) -> object:
        """What ``packed_token_logprobs`` takes for a trajectory (its tokens; a model that takes images: a
        ``VLSequence`` with its ``images``, PNG bytes). A text model takes no images: ValueError."""
        if images:
            raise ValueError("trajectories carry images but the model has no vision tower")
        return tokens

    def packed_inputs(self, sequences: Sequence, ids: list[torch.Tensor]) -> dict:
        """The forward's extra inputs for ``packed_token_logprobs``'s packed ``sequences`` (their token ids:
        ``ids``), on this model's device: none for a text model (a ``VLSequence`` with images is refused)."""
        if any(
            isinstance(s, VLSequence) and (s.pixel_values is not None or s.images is not None)
            for s in sequences
        ):
            raise ValueError(f"{type(self).__name__} takes no images (it is a text model)")
        return {}

    def extra_inputs(self, segments: list[Segment]) -> dict:
        """The forward's extra inputs for a packed batch's ``segments`` (model/forward_inputs.py: the hook the
        engine runner and the learner's packer both call). A text model has none; a segment with images or
        3D RoPE positions is refused (ValueError)."""
        return refuse_images(type(self).__name__, segments)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    # ---- the forward contract's cache: each family makes its own kind (a hybrid model adds recurrent state)
    def kv_page_bytes(self) -> int:
        """Bytes of one page of this model's engine cache (64 positions, every layer)."""
        return bytes_per_page(self.config)

    def new_kv_cache(self, num_pages: int, device: torch.device | str) -> KVCache:
        """The engine's paged cache for this model: K/V pages (``kv_cache``; ``CacheView`` reads it)."""
        return KVCache(self.config, num_pages=num_pages, device=device)

    def ops_for(self, device: torch.device | str) -> OpSet:
        """The op set this model's `kernels` names, for tensors on `device` (aligned on CUDA: Triton)."""
        return get_ops(self.kernels, device)

    @property
    def ops(self) -> OpSet:
        return self.ops_for(self.device)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, seed: int | None = None) -> None:
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.fill_(1.0)
            else:  # biases too (random, not zero: a test model then shows a path that drops one)
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)
        for name, b in self.named_buffers():  # DeepSeek's router correction bias (selection only)
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=gen, dtype=torch.float32) * std)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        seq_ids: torch.Tensor | None = None,
        kv_cache: CacheView | None = None,
        max_position: int | None = None,
        num_sequences: int | None = None,
        rope_positions: torch.Tensor | None = None,
        images: ImageEmbeddings | None = None,
        image_slots: torch.Tensor | None = None,
        text_rope_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final hidden states for a flat token stream [T] (or a padded batch [B, S]).

        Without kv_cache, a caller that knows them on the host passes ``max_position`` (the highest of
        ``positions``) and ``num_sequences`` (``seq_ids`` are then exactly 0..num_sequences-1): the forward
        then reads neither back from the device (``packed_token_logprobs`` does). Host syncs left in a
        packed forward on the Triton op set: one, the attention plan's ``torch.unique`` of its query tiles
        (rz_kernels.triton_ops.attention.plan_attention), once per forward, not per layer.

        positions: absolute positions, same shape as tokens. seq_ids: sequence index per token (row of
        the view's page table when kv_cache is given); None means a new sequence starts wherever
        positions == 0, and
        for a [B, S] batch each row is a sequence. Without kv_cache, each sequence attends to its own
        tokens in this call; with it, to its cached positions 0..position (the prefix must be cached).

        text_rope_positions: [T] the RoPE row each token rotates by (None: its position). The engine's decode
        step passes them for every family (one buffer layout): a text model's are its positions, a
        vision-language model's index + the sequence's M-RoPE delta. They lie in [0, position].
        The optional inputs ``rope_positions`` ([3, T]), ``images`` and ``image_slots`` are a model's that
        ``takes_images`` (Qwen3VLModel documents them); a text model refuses them.
        """
        shape = tokens.shape
        tokens, positions, seq_ids = flat_stream(tokens, positions, seq_ids)
        ctx = _Context(self, positions, seq_ids, kv_cache, max_position, num_sequences)
        slots = self._image_inputs(
            ctx, tokens, shape, rope_positions, images, image_slots, text_rope_positions
        )
        decoder = self.decoder
        x = decoder.embed_tokens(tokens)
        if slots is not None:  # the image placeholders' rows are the images' embeddings
            x = x.index_put((slots,), images.embeds.to(x.dtype))
        recompute = self.config.activation_checkpointing and torch.is_grad_enabled() and kv_cache is None
        for i, layer in enumerate(decoder.layers):
            x = checkpoint(layer, x, ctx, use_reentrant=False) if recompute else layer(x, ctx)
            if slots is not None and i < len(images.deepstack):  # deepstack: image features added mid-stack
                x = x.index_put((slots,), x[slots] + images.deepstack[i].to(x.dtype))
        return in_token_shape(decoder.norm(x, ctx.ops), shape)

    @property
    def decoder(self) -> DecoderStack:
        """The decoder's embedding, layers and final norm (Qwen3VLModel: its language model's)."""
        return self.model

    def _image_inputs(
        self,
        ctx: _Context,
        tokens: torch.Tensor,
        shape: torch.Size,
        rope_positions: torch.Tensor | None,
        images: ImageEmbeddings | None,
        image_slots: torch.Tensor | None,
        text_rope_positions: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """The forward's rotation and image inputs: sets the tokens' rotation on ``ctx`` and returns the
        stream indices of the image rows (None: no images). A text model takes only ``text_rope_positions``
        (one RoPE row per token)."""
        if any(v is not None for v in (rope_positions, images, image_slots)):
            raise ValueError(
                f"{type(self).__name__} takes no rope_positions or image inputs (it is a text model)"
            )
        if text_rope_positions is not None:
            if text_rope_positions.shape != tokens.shape:
                raise ValueError(f"text_rope_positions must be [{tokens.shape[0]}] (one per token)")
            ctx.rope_positions = text_rope_positions  # (rows of the prechecked table: callers keep <= top)
        return None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head in the op set's GEMM, returned as fp32 [..., vocab]."""
        out = self.ops_for(hidden.device).linear(hidden, self.lm_head.weight)
        # The aligned GEMM's output may be a view of its row-padded buffer, and FSDP2 warns on every call of
        # a sharded root's forward method (this is one) that returns a view. A bf16 model's cast below is a
        # copy already; an fp32 model's output that autograd sees gets the same one copy (same bits).
        if out.dtype == torch.float32 and out.requires_grad and out._base is not None:
            return out.clone()
        return out.float()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())
