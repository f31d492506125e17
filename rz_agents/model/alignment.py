"""Alignment checker: cached inference vs training forward, compared bit for bit.

For a model, many random batch compositions are pushed through
- the cached-inference path: sequences share forward calls in any mix of chunked prefill, full
  prefill and single-token decode (teacher-forced), in random pages of the paged KV cache (scattered
  in memory, out of order) that hold stale data from earlier cases;
- the training forward: packed streams in random order, and padded [B, S] batches;
and each sequence's per-token log-probs are compared with `torch.equal` against one reference:
the sequence's own packed training forward. The cached path runs with the projections fused (one GEMM for
q/k/v and one for gate/up, as in the engine), the training forward with one GEMM per weight (as in the
learner). `bit_identical` is the verdict; `max_abs_dlogp` the
largest difference seen (0.0 exactly when aligned).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

import torch

from rz_agents.model.config import ARCHS, ModelConfig
from rz_agents.model.deepseek_v4_config import DeepseekV4Config
from rz_agents.model.hf_files import build_model
from rz_agents.model.kimi_linear_config import KimiLinearConfig
from rz_agents.model.kv_cache import KVCache, pages_for
from rz_agents.model.logprobs import packed_token_logprobs, token_logprobs
from rz_agents.model.qwen3_5_config import MODEL_TYPES as QWEN3_5_TYPES
from rz_agents.model.qwen3_5_config import MOE_TYPES as QWEN3_5_MOE_TYPES
from rz_agents.model.qwen3_5_config import Qwen35Config
from rz_agents.model.transformer import Transformer

# families align-check builds random tiny models of: ModelConfig's, the hybrid linear-attention ones (Qwen3.5
# dense and MoE; Kimi Linear: KDA + MLA + MoE) and DeepSeek-V4 (its own model class: compressed sparse
# attention, hyper-connections)
CHECKED_ARCHS = (*ARCHS, "qwen3_5", "qwen3_5_moe", "kimi_linear", "deepseek_v4")

DEFAULT_BATCH_SIZES = (1, 2, 3, 7, 15, 16, 17, 31, 63, 64, 65, 100, 129)


@dataclass
class AlignmentReport:
    arch: str
    dtype: str
    kernels: str
    threads: int
    device: str = "cpu"
    cases: int = 0
    tokens_checked: int = 0
    mismatched_tokens: int = 0
    max_abs_dlogp: float = 0.0
    failures: list[str] = field(default_factory=list)
    # a model with discrete selections (DeepSeek-V4: the indexer's top-k, the routers): per kind, the token
    # rows of every layer compared between the cached path and the packed forward, and those that differ
    selections_checked: dict[str, int] = field(default_factory=dict)
    selection_flips: dict[str, int] = field(default_factory=dict)

    @property
    def bit_identical(self) -> bool:
        return (
            self.mismatched_tokens == 0 and self.tokens_checked > 0 and not any(self.selection_flips.values())
        )

    def to_json(self) -> dict:
        d = asdict(self)
        d["bit_identical"] = self.bit_identical
        d["failures"] = self.failures[:5]
        return d

    def compare(self, what: str, got: torch.Tensor, ref: torch.Tensor) -> None:
        got, ref = got.detach(), ref.detach()
        self.tokens_checked += ref.numel()
        if not torch.equal(got, ref):
            diff = (got - ref).abs()
            diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
            self.mismatched_tokens += int((got != ref).sum())
            self.max_abs_dlogp = max(self.max_abs_dlogp, float(diff.max()))
            if len(self.failures) < 20:
                self.failures.append(f"{what}: max |dlogp| {float(diff.max()):.3g}")

    def compare_selections(self, got: list, ref: list) -> None:
        """Count the token rows whose selection (each layer's [n, k] indices) differs from the reference's."""
        for (kind, g), (_, r) in zip(got, ref, strict=True):
            self.selections_checked[kind] = self.selections_checked.get(kind, 0) + r.shape[0]
            flips = int((g.cpu() != r.cpu()).any(dim=-1).sum())
            self.selection_flips[kind] = self.selection_flips.get(kind, 0) + flips


def random_config(
    arch: str, dtype: str, rng: random.Random
) -> ModelConfig | Qwen35Config | KimiLinearConfig | DeepseekV4Config:
    """A small random model config of the given family (vocab large enough to be realistic)."""
    if arch == "deepseek_v4":  # sliding, CSA (m=4), HCA (m'=16), CSA; hash and learned MoE
        return DeepseekV4Config.tiny(dtype=dtype, vocab_size=rng.choice([512, 1000]))
    if arch in QWEN3_5_TYPES:  # 3 Gated DeltaNet layers and 1 full attention
        moe = arch in QWEN3_5_MOE_TYPES  # (every layer's MLP routed: 8 experts, top 2, a shared expert)
        return Qwen35Config.tiny(moe=moe, dtype=dtype, vocab_size=rng.choice([512, 1000]))
    if arch == "kimi_linear":  # 3 KDA layers and 1 MLA, MoE after the first layer
        return KimiLinearConfig.tiny(dtype=dtype, vocab_size=rng.choice([512, 1000]))
    heads = rng.choice([4, 8])
    kv = rng.choice([h for h in (1, 2, 4) if heads % h == 0])
    extra = {}
    if arch == "qwen3_moe":
        extra = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    return ModelConfig.tiny(
        arch,
        dtype=dtype,
        vocab_size=rng.choice([512, 1000]),
        hidden_size=64,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=16,
        num_hidden_layers=2,
        **extra,
    )


def run_cached(
    model: Transformer,
    seqs: list[torch.Tensor],
    cache: KVCache,
    rng: random.Random,
    chunked: bool,
    selections: list | None = None,
) -> list[torch.Tensor]:
    """Log-probs of tokens[1:] for each sequence via the KV-cache path, continuous-batching style.

    Each sequence gets random pages (a page table scattered over the cache, in no particular order),
    a prompt part (prefilled in one piece or in random chunks) and a decoded tail (one token per
    forward). All active sequences share every forward call. ``selections`` (a list, for a model that
    traces its discrete selections) receives each sequence's, as ``packed_selections`` gives them.
    """
    n = len(seqs)
    device = cache.device
    width = max(pages_for(len(s)) for s in seqs)
    picked = rng.sample(range(cache.num_pages), sum(pages_for(len(s)) for s in seqs))
    table = torch.zeros(n, width, dtype=torch.long)
    for i, s in enumerate(seqs):
        mine, picked = picked[: pages_for(len(s))], picked[pages_for(len(s)) :]
        table[i, : len(mine)] = torch.tensor(mine, dtype=torch.long)
    view = cache.view(table)
    decode_from = [max(1, len(s) - rng.randint(1, max(1, len(s) // 2))) for s in seqs]
    cursor = [0] * n
    out: list[list[torch.Tensor]] = [[] for _ in range(n)]
    traced: list[list] = [[] for _ in range(n)]  # per sequence: each forward's [(kind, [step, k])]
    with torch.no_grad():
        while True:
            tok, pos, sid, owner = [], [], [], []
            for i, s in enumerate(seqs):
                c = cursor[i]
                if c >= len(s):
                    continue
                if c < decode_from[i]:
                    step = rng.randint(1, 48) if chunked else decode_from[i] - c
                    step = min(step, decode_from[i] - c)
                else:
                    step = 1
                tok.append(s[c : c + step])
                pos.append(torch.arange(c, c + step))
                sid.append(torch.full((step,), i, dtype=torch.long))
                owner.append((i, c, step))
                cursor[i] = c + step
            if not tok:
                break
            args = (torch.cat(tok).to(device), torch.cat(pos).to(device), torch.cat(sid).to(device))
            hidden, trace = _traced(model, selections is not None, *args, kv_cache=view)
            _split_trace(trace, owner, traced)
            rows, targets, spans = [], [], []
            offset = 0
            for i, c, step in owner:
                k = min(step, len(seqs[i]) - 1 - c)  # rows that have a next token
                rows.append(hidden[offset : offset + k])
                targets.append(seqs[i][c + 1 : c + 1 + k])
                spans.append((i, k))
                offset += step
            logp = token_logprobs(model, torch.cat(rows), torch.cat(targets).to(device)).cpu()
            for (i, _k), part in zip(spans, torch.split(logp, [k for _, k in spans]), strict=True):
                out[i].append(part)
    if selections is not None:
        selections.extend(
            [(kind, torch.cat([f[j][1] for f in forwards])) for j, (kind, _) in enumerate(forwards[0])]
            for forwards in traced
        )
    return [torch.cat(parts) if parts else torch.zeros(0) for parts in out]


def _traced(model, trace_on: bool, *args, **kwargs) -> tuple[torch.Tensor, list]:
    """The model's forward and, when ``trace_on``, the selections it made ([(kind, [T, k])] per layer)."""
    if not trace_on:
        return model(*args, **kwargs), []
    model.selection_trace = trace = []
    try:
        return model(*args, **kwargs), trace
    finally:
        model.selection_trace = None


def _split_trace(trace: list, owner: list[tuple[int, int, int]], traced: list[list]) -> None:
    """Hand each sequence its rows of one forward's selections (owner: (sequence, start, step) in order)."""
    if not trace:
        return
    offset = 0
    for i, _c, step in owner:
        traced[i].append([(kind, sel[offset : offset + step]) for kind, sel in trace])
        offset += step


def packed_selections(model, seqs: list[torch.Tensor]) -> list[list]:
    """Each sequence's selections [(kind, [len, k]) per selecting layer] in one packed training forward."""
    lens = [len(s) for s in seqs]
    device = model.device
    tokens = torch.cat(seqs).to(device)
    positions = torch.cat([torch.arange(n) for n in lens]).to(device)
    seq_ids = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lens)]).to(device)
    with torch.no_grad():
        _, trace = _traced(model, True, tokens, positions, seq_ids)
    starts = [sum(lens[:i]) for i in range(len(lens))]
    return [[(kind, sel[a : a + n]) for kind, sel in trace] for a, n in zip(starts, lens, strict=True)]


def run_padded(
    model: Transformer, seqs: list[torch.Tensor], vocab: int, gen: torch.Generator
) -> list[torch.Tensor]:
    """Log-probs via a padded [B, S] training batch (random pad tokens after each sequence)."""
    width = max(len(s) for s in seqs)
    tokens = torch.randint(0, vocab, (len(seqs), width), generator=gen)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
    positions = torch.arange(width).expand(len(seqs), width)
    device = model.device
    with torch.no_grad():
        hidden = model(tokens.to(device), positions.to(device))
    out = []
    for i, s in enumerate(seqs):
        out.append(token_logprobs(model, hidden[i, : len(s) - 1], s[1:].to(device)).cpu())
    return out


def check_model(
    model: Transformer,
    *,
    seed: int = 0,
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
    max_len: int = 160,
    threads: int | None = None,
) -> AlignmentReport:
    """Run the alignment check on one model with its current op set (fused projections on the cached path,
    for a model that fuses them, as the engine does)."""
    if not hasattr(model, "fuse_projections"):
        return _check_model(model, seed, batch_sizes, max_len, threads)
    was_fused = model.fused_projections
    model.fuse_projections()
    try:
        return _check_model(model, seed, batch_sizes, max_len, threads)
    finally:
        model.fuse_projections(was_fused)


def _check_model(
    model: Transformer, seed: int, batch_sizes: tuple[int, ...], max_len: int, threads
) -> AlignmentReport:
    if threads:
        torch.set_num_threads(threads)
    cfg = model.config
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    report = AlignmentReport(
        cfg.model_type, cfg.dtype, model.kernels, torch.get_num_threads(), device=str(model.device)
    )
    vocab = cfg.vocab_size
    traces = hasattr(model, "selection_trace")  # a model with discrete selections (DeepSeek-V4) records them

    def rand_seq(lo: int = 2) -> torch.Tensor:
        return torch.randint(0, vocab, (rng.randint(lo, max_len),), generator=gen)

    needle = torch.randint(0, vocab, (max_len,), generator=gen)
    with torch.no_grad():
        needle_ref = packed_token_logprobs(model, [needle])[0].cpu()
    # the model's own cache kind (paged K/V; a hybrid model's recurrent state beside it)
    cache = model.new_kv_cache((max(batch_sizes) + 1) * pages_for(max_len), model.device)
    # Stale, finite garbage in every page: a cache is never clean in a running engine.
    for t in cache.buffers():
        t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))

    for b in batch_sizes:
        for chunked in (False, True):
            seqs = [rand_seq() for _ in range(b - 1)]
            at = rng.randint(0, b - 1)
            seqs.insert(at, needle)
            with torch.no_grad():
                refs = [r.cpu() for r in packed_token_logprobs(model, seqs)]  # one packed training forward
            selections = [] if traces else None
            got = run_cached(model, seqs, cache, rng, chunked, selections)
            for sel, ref in zip(
                selections or [], packed_selections(model, seqs) if traces else [], strict=True
            ):
                report.compare_selections(sel, ref)
            report.cases += 1
            mode = "chunked" if chunked else "full"
            report.compare(f"cached b={b} {mode} needle", got[at], needle_ref)
            report.compare(f"packed b={b} needle", refs[at], needle_ref)
            for i in range(b):
                if i != at:
                    report.compare(f"cached b={b} {mode} seq{i}", got[i], refs[i])
        # Training forward on a shuffled packed stream and on a padded batch.
        seqs = [rand_seq() for _ in range(b - 1)]
        at = rng.randint(0, b - 1)
        seqs.insert(at, needle)
        order = list(range(b))
        rng.shuffle(order)
        with torch.no_grad():
            packed = [r.cpu() for r in packed_token_logprobs(model, [seqs[i] for i in order])]
        report.compare(f"packed-shuffled b={b} needle", packed[order.index(at)], needle_ref)
        padded = run_padded(model, seqs, vocab, gen)
        report.compare(f"padded b={b} needle", padded[at], needle_ref)
        report.cases += 1
    return report


def check_random_models(
    archs=("qwen3", "qwen3_moe"),
    dtypes=("float32", "bfloat16"),
    kernels=("aligned", "standard"),
    seed: int = 0,
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
    max_len: int = 160,
    threads: int | None = None,
    device: torch.device | str = "cpu",
) -> list[AlignmentReport]:
    """check_model over random tiny models for every (arch, dtype, kernels), on `device`."""
    reports = []
    for arch in archs:
        for dtype in dtypes:
            rng = random.Random(f"{seed}-{arch}-{dtype}")
            cfg = random_config(arch, dtype, rng)
            model = _random_model(cfg)
            model.reset_parameters(std=0.1, seed=rng.randrange(2**31))
            model.to(device)
            for k in kernels:
                model.set_kernels(k)
                reports.append(
                    check_model(model, seed=seed, batch_sizes=batch_sizes, max_len=max_len, threads=threads)
                )
    return reports


def _random_model(cfg):
    """The model class of a random config (DeepSeek-V4 has its own; hf_files.build_model the others)."""
    if isinstance(cfg, DeepseekV4Config):
        from rz_agents.model.deepseek_v4 import DeepseekV4ForCausalLM

        return DeepseekV4ForCausalLM(cfg)
    return build_model(cfg)
