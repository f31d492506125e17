"""`rz align-check`: prove the engine path and the training forward agree bit for bit."""

from __future__ import annotations

import argparse
import json
import sys

from rz_agents.model.alignment import CHECKED_ARCHS, DEFAULT_BATCH_SIZES, check_model, check_random_models


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "align-check",
        help="check that cached inference and the training forward give bit-identical log-probs",
        description=(
            "Runs random batch compositions (batch sizes, chunked/full prefill, decode, packed and padded "
            "training batches) through the cached-inference path and the training forward of random tiny "
            "models (or --checkpoint) and compares per-token log-probs with torch.equal. Exits 0 only when "
            "every aligned case is bit-identical AND the standard op set differs somewhere (negative "
            "control)."
        ),
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per (arch, dtype, kernels)")
    p.add_argument(
        "--arch",
        nargs="+",
        default=["qwen3", "qwen3_moe"],
        choices=list(CHECKED_ARCHS),
    )
    p.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(DEFAULT_BATCH_SIZES))
    p.add_argument("--max-len", type=int, default=160, help="longest random sequence")
    p.add_argument("--threads", type=int, default=None, help="torch threads (pinned for the whole check)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda or cuda:N (on CUDA the aligned op set is the Triton kernels)",
    )
    p.add_argument(
        "--checkpoint", default=None, help="HF checkpoint directory to check instead of random models"
    )
    p.add_argument(
        "--engine",
        default="rz",
        choices=["rz", "vllm"],
        help="rz: our cached path; vllm: measure the vLLM backend's mismatch against our trainer",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rz_agents.runtime.device import DeviceError, resolve_device

    try:
        device = resolve_device(args.device)
    except DeviceError as exc:
        print(f"rz align-check: {exc}", file=sys.stderr)
        return 2
    if args.engine == "vllm":
        try:
            from rz_agents.engine.vllm_mismatch import measure_vllm_mismatch
        except ImportError as exc:
            print(f"rz align-check --engine vllm: vLLM backend unavailable ({exc})", file=sys.stderr)
            return 2
        result = measure_vllm_mismatch(args)
        print(json.dumps(result) if args.json else result)
        return 0

    if args.checkpoint:
        from rz_agents.model.checkpoint import load_hf_checkpoint

        reports = []
        for dtype in args.dtype:
            model = load_hf_checkpoint(args.checkpoint, dtype=dtype, device=device)
            for kernels in ("aligned", "standard"):
                model.set_kernels(kernels)
                reports.append(
                    check_model(
                        model,
                        seed=args.seed,
                        batch_sizes=tuple(args.batch_sizes),
                        max_len=args.max_len,
                        threads=args.threads,
                    )
                )
    else:
        reports = check_random_models(
            archs=tuple(args.arch),
            dtypes=tuple(args.dtype),
            seed=args.seed,
            batch_sizes=tuple(args.batch_sizes),
            max_len=args.max_len,
            threads=args.threads,
            device=device,
        )
    aligned = [r for r in reports if r.kernels == "aligned"]
    standard = [r for r in reports if r.kernels == "standard"]
    ok_aligned = all(r.bit_identical for r in aligned)
    control_differs = any(r.mismatched_tokens > 0 for r in standard)
    for r in reports:
        if args.json:
            print(json.dumps(r.to_json()), flush=True)
        else:
            verdict = "bit-identical" if r.bit_identical else f"DIFFERS ({r.mismatched_tokens} tokens)"
            flips = "".join(
                f" {kind}_flips={r.selection_flips[kind]}/{n}" for kind, n in r.selections_checked.items()
            )
            print(
                f"{r.arch:10s} {r.dtype:9s} {r.kernels:8s} threads={r.threads} cases={r.cases} "
                f"tokens={r.tokens_checked} max|dlogp|={r.max_abs_dlogp:.3g}{flips}  {verdict}"
            )
    total = sum(r.tokens_checked for r in aligned)
    summary = {
        "aligned_bit_identical": ok_aligned,
        "standard_differs": control_differs,
        "aligned_tokens_checked": total,
    }
    print(
        json.dumps(summary)
        if args.json
        else f"aligned tokens checked: {total}; aligned ok: {ok_aligned}; "
        f"negative control differs: {control_differs}"
    )
    return 0 if ok_aligned and control_differs else 1
