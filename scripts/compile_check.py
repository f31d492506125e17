#!/usr/bin/env python3
"""Compile check: every Triton launch of the GPU path compiled for Hopper and Ampere, without a GPU.

    python3 scripts/compile_check.py --json --out compile_check.json   # full: 4B + 30B-A3B, sm_90a +
                                                                        # sm_80, pinned triton + 3.6.0
    python3 scripts/compile_check.py --subset ci                       # 4B decode + train, sm_90a,
                                                                        # pinned triton (the CI test)
    python3 scripts/compile_check.py --triton pinned --triton /opt/triton360   # Triton versions

1. Records every Triton launch the engine (prefill, chunked prefill, decode at every CUDA-graph bucket, graph
   capture and eager at 2K / 8K context) and the learner (forward + backward of its micro-batches) make at the
   recipes' shapes (configs/qwen3-4b-python-tool.yaml, configs/qwen3-30b-a3b-python-tool.yaml), on meta
   tensors (rz_agents.compile_check.workloads, rz_kernels.compile_check.recorder).
2. Compiles each distinct launch for each target with each Triton version (``--triton DIR``: a
   ``pip install --target DIR triton==X`` put first on a worker's sys.path), cached on disk (``--cache``).
3. Reports per kernel: compiled or the error, registers, spills, shared memory vs the limit, MMA family, and
   grids vs 132 SMs; the engine-vs-trainer cubin identity table; the static cost model's decode and train
   bounds (rz_kernels.compile_check.cost_model; report key ``bounds``): the Triton launches at the H200's
   datasheet bandwidth, a lower bound on their time, never a prediction of the step (docs/gpus.md, "Decode
   step: bound and estimate"; the estimate is ``scripts/decode_cost_table.py``'s).

Exit status 1 if a launch failed to compile, went over the shared-memory limit, or an op's engine and trainer
binaries differ without a stated reason.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "kernels"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
os.environ.pop("TRITON_INTERPRET", None)  # the recorder needs @triton.jit functions, not interpreted ones

H200_SMS = 132


def _record(models: list[str], subset: str | None, log) -> tuple[list, dict[str, dict]]:
    """The launches of each recipe, and each recipe's model config fields (for the roofline)."""
    import dataclasses

    from rz_agents.compile_check.op_workloads import OP_RECIPES
    from rz_agents.compile_check.workloads import RECIPES, recipe_shapes, record_recipe, text_config

    launches, fields = [], {}
    for name in models:
        t0 = time.perf_counter()
        if name in OP_RECIPES:  # a new family's own ops, recorded op by op (no model fields: no roofline)
            got = OP_RECIPES[name](name)
            log(f"recorded {name}: {len(got)} launches, {len({x.key() for x in got})} distinct "
                f"({time.perf_counter() - t0:.1f} s)")  # fmt: skip
            launches.extend(got)
            continue
        # launches are tagged with the recipe's name (the identity tables and counts filter by it), not the
        # preset's: "qwen2.5-1.5b" runs the preset "qwen2.5-1.5b-instruct" (its table was empty before)
        shapes = dataclasses.replace(recipe_shapes(RECIPES[name], ROOT), name=name)
        fields[name] = dataclasses.asdict(text_config(shapes.model))  # a VL model: its decoder's
        if subset == "ci":  # the 4B decode and train shapes: buckets up to 128, the two contexts, no prefill
            got = record_recipe(shapes, buckets=[1, 16, 48, 128], contexts=(2048, 8192), prefill=False)
        else:
            got = record_recipe(shapes)
        log(f"recorded {name}: {len(got)} launches, {len({x.key() for x in got})} distinct "
            f"({time.perf_counter() - t0:.1f} s)")  # fmt: skip
        launches.extend(got)
    return launches, fields


def _grids(launches: list) -> dict[str, list[dict]]:
    """Per launch key, its distinct grids with the shapes they came from (programs vs SMs)."""
    out: dict[str, dict[tuple, dict]] = defaultdict(dict)
    for x in launches:
        t = x.tags
        ident = (t.get("model"), t.get("side"), t.get("phase"), t.get("rows"), t.get("context"), x.grid,
                 x.args.get("N"), x.args.get("K"), bool(t.get("in_backward")))  # fmt: skip
        if ident in out[x.key()]:
            continue
        programs = x.grid[0] * x.grid[1] * x.grid[2]
        out[x.key()][ident] = {
            "model": t.get("model"), "side": t.get("side"), "phase": t.get("phase"), "rows": t.get("rows"),
            "context": t.get("context"), "backward": bool(t.get("in_backward")), "grid": list(x.grid),
            "programs": programs, "waves_on_132_sms": round(programs / H200_SMS, 3),
            "N": x.args.get("N"), "K": x.args.get("K"),
        }  # fmt: skip
    return {k: list(v.values()) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--models",
        default="qwen3-4b,qwen3-30b-a3b,qwen2.5-1.5b,deepseek-v3,qwen3.5-gdn,kimi-linear-kda,deepseek-v4-sparse",
        help="recipes (comma separated; qwen3.5-gdn, kimi-linear-kda and deepseek-v4-sparse: those families' "
        "own ops)",
    )
    ap.add_argument("--targets", default="sm_90a,sm_80", help="sm_90a and/or sm_80")
    ap.add_argument("--triton", action="append", default=None,
                    help="'pinned' (this interpreter's triton) or a --target install dir; repeatable "
                         "(default: pinned, plus /opt/triton360 if it exists)")  # fmt: skip
    ap.add_argument(
        "--subset", choices=["ci"], default=None, help="ci: 4B decode + train, sm_90a, pinned triton"
    )
    ap.add_argument("--cache", default=None, help="compile cache dir (default ~/.cache/rz_compile_check)")
    ap.add_argument("--workers", type=int, default=1, help="compile worker processes")
    ap.add_argument("--out", default=None, help="write the JSON report here")
    ap.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    args = ap.parse_args(argv)

    from rz_kernels.compile_check import compile as cc
    from rz_kernels.compile_check.identity import identity_table

    log = (
        (lambda *a: print(*a, file=sys.stderr, flush=True))
        if args.json
        else (lambda *a: print(*a, flush=True))
    )
    t_start = time.perf_counter()
    models = [m for m in args.models.split(",") if m]
    targets = [t for t in args.targets.split(",") if t]
    tritons = args.triton or (
        ["pinned"] + (["/opt/triton360"] if Path("/opt/triton360/triton").exists() else [])
    )
    if args.subset == "ci":
        models, targets, tritons = ["qwen3-4b"], ["sm_90a"], ["pinned"]
    for t in targets:
        if t not in cc.TARGETS:
            ap.error(f"--targets: unknown target {t!r}; expected one of {sorted(cc.TARGETS)}")
    caps = [cc.TARGETS[t] for t in targets]
    cache = Path(args.cache) if args.cache else cc.DEFAULT_CACHE

    launches, model_fields = _record(models, args.subset, log)
    t_recorded = time.perf_counter()
    distinct: dict[str, dict] = {}
    for x in launches:
        distinct.setdefault(x.key(), x.to_json())
    report: dict = {
        "models": models, "targets": targets, "subset": args.subset,
        "recorded": {m: {"launches": sum(x.tags.get("model") == m for x in launches),
                         "distinct": len({x.key() for x in launches if x.tags.get("model") == m})}
                     for m in models},
        "distinct_launches": len(distinct), "compile": {}, "kernels": [], "identity": {},
    }  # fmt: skip
    all_results: dict[str, dict] = {}
    for tr in tritons:
        path = None if tr == "pinned" else tr
        version, results = cc.compile_all(distinct, caps, path, cache, args.workers, log)
        all_results[version] = results
        per_target = {}
        for t, cap in zip(targets, caps, strict=True):
            rs = [results[(k, cap)] for k in distinct]
            per_target[t] = {
                "compiled": sum(bool(r.get("ok")) for r in rs),
                "failed": sum(not r.get("ok") for r in rs),
                "over_shared_limit": sum(bool(r.get("over_shared_limit")) for r in rs),
                "with_spills": sum(r.get("spill_stores", 0) > 0 or r.get("spill_loads", 0) > 0 for r in rs),
                "max_shared": max((r.get("shared", 0) for r in rs), default=0),
                "max_registers": max((r.get("registers", 0) for r in rs), default=0),
            }
        report["compile"][version] = {"path": tr, **per_target}
        log(f"triton {version} ({tr}): " + "; ".join(
            f"{t}: {v['compiled']} compiled, {v['failed']} failed, {v['over_shared_limit']} over smem, "
            f"{v['with_spills']} spilling" for t, v in per_target.items()))  # fmt: skip
    grids = _grids(launches)
    tags_by_key: dict[str, set] = defaultdict(set)
    for x in launches:
        tags_by_key[x.key()].add(f"{x.tags.get('model')}:{x.tags.get('side')}:{x.tags.get('phase')}")
    for key, launch in distinct.items():
        entry = {
            "kernel": launch["kernel"].rsplit(".", 1)[-1],
            "constexprs": launch["constexprs"], "num_warps": launch["num_warps"],
            "num_stages": launch["num_stages"], "signature": launch["signature"], "attrs": launch["attrs"],
            "used_by": sorted(tags_by_key[key]),
            "results": {
                f"triton-{v}/{t}": {k2: r[(key, cap)].get(k2) for k2 in (
                    "ok", "error", "registers", "spill_stores", "spill_loads", "shared", "over_shared_limit",
                    "mma", "mma_shapes", "cubin_sha256", "seconds") if k2 in r[(key, cap)]}
                for v, r in all_results.items() for t, cap in zip(targets, caps, strict=True)
            },
            "grids": grids[key],
        }  # fmt: skip
        report["kernels"].append(entry)
    pinned_version = next(iter(all_results))
    ok_identity = True
    for m in models:
        for t, cap in zip(targets, caps, strict=True):
            table = identity_table(launches, all_results[pinned_version], cap, model=m)
            report["identity"][f"{m}/{t}/triton-{pinned_version}"] = table
            if not table:  # no shared op found: a filter that matched nothing, never a pass
                ok_identity = False
                log(f"identity {m}/{t}: EMPTY (no engine or trainer launch tagged {m!r})")
            for row in table:
                if row["verdict"] not in ("identical", "one side only") and not row.get("why_the_bits_agree"):
                    ok_identity = False
                if row["verdict"] == "different" and row.get("why_the_bits_agree", "").endswith("a defect."):
                    ok_identity = False
    report["identity_ok"] = ok_identity
    try:
        from rz_kernels.compile_check.cost_model import report_bounds

        report["bounds"] = report_bounds(launches, model_fields)
    except ImportError:
        pass
    report["seconds"] = {
        "record": round(t_recorded - t_start, 1),
        "total": round(time.perf_counter() - t_start, 1),
    }
    failed = sum(
        v[t]["failed"] + v[t]["over_shared_limit"] for v in report["compile"].values() for t in targets
    )
    report["ok"] = failed == 0 and ok_identity
    text = json.dumps(report, indent=1, default=str)
    if args.out:
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(args.out)
    if args.json:
        print(text)
    else:
        _summary(report, log)
    return 0 if report["ok"] else 1


def _summary(report: dict, log) -> None:
    for key, table in report["identity"].items():
        log(f"identity {key}: " + ", ".join(f"{r['op']}={r['verdict']}" for r in table))
    for k in report["kernels"]:
        for name, r in k["results"].items():
            if not r.get("ok") or r.get("over_shared_limit") or r.get("spill_stores"):
                log(f"  {k['kernel']} {name}: {r.get('error') or ''} shared={r.get('shared')} "
                    f"spills={r.get('spill_stores')}/{r.get('spill_loads')}")  # fmt: skip
    from rz_kernels.compile_check.cost_model import CUBLAS_EFFICIENCY

    bounds = report.get("bounds")
    if bounds:  # lower bounds (docs/gpus.md's "bound" and "triton bound"), never a prediction of the step
        for row in bounds.get("decode", []):
            if row["batch"] not in (1, 16, 48, 128):
                continue
            head = f"{row['model']} decode b{row['batch']} ctx {row['context']} (H200)"
            if "bound_ms" not in row:  # an op recipe (no model fields): the Triton launches' bound alone
                log(f"{head}: triton bound {row['triton_bound_ms']:.3f} ms for these ops")
                continue
            log(f"{head}: triton bound {row['triton_bound_ms']:.2f} ms (<= {row['tokens_per_s']:.0f} tok/s), "
                f"bound {row['bound_ms']:.2f} ms, bound / triton bound {row['fraction_of_roofline']:.2f}; "
                "the estimate: scripts/decode_cost_table.py")  # fmt: skip
        for row in bounds.get("train", []):
            log(f"{row['model']} train micro-batch of {row['tokens']} tokens in {row['sequences']} sequences "
                f"(H200): triton bound {row['triton_ms']:.1f} ms + cuBLAS backward "
                f"{row['cublas_backward_gemm_ms']:.1f} ms (at {CUBLAS_EFFICIENCY} of peak) = "
                f"{row['micro_batch_ms']:.1f} ms ({row['tokens_per_s']:.0f} tok/s)")  # fmt: skip
    log(f"ok={report['ok']} in {report['seconds']['total']} s")


if __name__ == "__main__":
    sys.exit(main())
