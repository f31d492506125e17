"""Compile recorded Triton launches for a GPU target on a machine without a GPU, and read what came out.

``triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", cap, 32))`` runs
the whole pipeline (TTIR, TTGIR, LLVM IR, PTX, and a cubin from the wheel's own ``ptxas``) with no driver.
For each distinct launch and target this module reports: compiled or the compiler's error, registers and
spills (from ``ptxas -v``, which Triton already runs), shared memory (the kernel's metadata), the MMA
family in the PTX (``wgmma`` / ``mma.sync``) and the cubin's SHA-256 (byte identity).

Compiles run in a worker subprocess, so that another Triton version (e.g. 3.6.0 installed with
``pip install --target DIR``) can be put first on its ``sys.path``; results are cached on disk by
(launch key, target, Triton version), so a second run only compiles what changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Shared memory per block the hardware allows (opt-in maximum): H100/H200 and A100.
SHARED_LIMIT = {90: 227 * 1024, 80: 163 * 1024}
TARGETS = {"sm_90a": 90, "sm_80": 80}
DEFAULT_CACHE = Path(os.environ.get("RZ_COMPILE_CHECK_CACHE", Path.home() / ".cache" / "rz_compile_check"))


def _kernel_fn(qualified: str):
    module, _, name = qualified.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _constexpr(v: Any) -> Any:
    if isinstance(v, dict) and "tl_dtype" in v:
        import triton.language as tl

        return tl.dtype(v["tl_dtype"])
    return v


def _ptxas_figures(log: str) -> dict[str, int]:
    """Registers and spill bytes from a ``ptxas -v`` log."""
    out: dict[str, int] = {}
    if m := re.search(r"Used (\d+) registers", log):
        out["registers"] = int(m.group(1))
    if m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log):
        out["spill_stores"], out["spill_loads"] = int(m.group(1)), int(m.group(2))
    if m := re.search(r"(\d+) bytes stack frame", log):
        out["stack_frame"] = int(m.group(1))
    return out


def mma_family(ptx: str) -> str:
    """The tensor-core instruction family a PTX uses: "wgmma", "mma.sync", both, or "none"."""
    fams = [name for name, pat in (("wgmma", "wgmma.mma_async"), ("mma.sync", "mma.sync")) if pat in ptx]
    return "+".join(fams) if fams else "none"


def mma_shapes(ptx: str) -> list[str]:
    """The distinct MMA instructions of a PTX (shape and types), e.g. mma.sync.aligned.m16n8k16.row.col...."""
    return sorted(set(re.findall(r"(wgmma\.mma_async\.[\w.]+|mma\.sync\.aligned\.[\w.]+)", ptx)))


def _ptxas_log_of(ptx: str, capability: int) -> str:
    """``ptxas -v`` of a PTX, with the wheel's ptxas (when Triton's own log was not captured)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        arch = sm_arch_from_capability(capability)
        cmd = [get_ptxas(capability).path, "-v", f"--gpu-name={arch}", str(src), "-o", str(Path(d) / "k.o")]
        return subprocess.run(cmd, capture_output=True, text=True).stderr


def compile_one(launch: dict, capability: int) -> dict:
    """Compile one recorded launch (``Launch.to_json()``) for ``capability`` (90: sm_90a, 80: sm_80)."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _kernel_fn(launch["kernel"])
    names = list(fn.arg_names)
    constexprs = {(names.index(k),): _constexpr(v) for k, v in launch["constexprs"].items()}
    attrs = {(names.index(k),): [tuple(a) for a in v] for k, v in launch["attrs"].items()}
    src = ASTSource(fn=fn, signature=launch["signature"], constexprs=constexprs, attrs=attrs)
    options = {"num_warps": launch["num_warps"], "num_stages": launch["num_stages"]}
    t0 = time.perf_counter()
    log = io.StringIO()
    result: dict[str, Any] = {"triton": triton.__version__, "capability": capability}
    try:
        with contextlib.redirect_stdout(log):
            old = getattr(knobs.nvidia, "dump_ptxas_log", None)
            if old is not None:
                knobs.nvidia.dump_ptxas_log = True
            try:
                kernel = triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)
            finally:
                if old is not None:
                    knobs.nvidia.dump_ptxas_log = old
    except Exception as exc:  # noqa: BLE001 - the compiler's error is the result
        result.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:2000]}")
        result["seconds"] = round(time.perf_counter() - t0, 3)
        return result
    ptx = kernel.asm["ptx"]
    cubin = kernel.asm["cubin"]
    ptxas_log = log.getvalue()
    if "Used" not in ptxas_log:
        ptxas_log = _ptxas_log_of(ptx, capability)
    shared = int(kernel.metadata.shared)
    result.update(
        ok=True,
        shared=shared,
        shared_limit=SHARED_LIMIT.get(capability),
        over_shared_limit=shared > SHARED_LIMIT.get(capability, 1 << 62),
        mma=mma_family(ptx),
        mma_shapes=mma_shapes(ptx),
        cubin_sha256=hashlib.sha256(cubin).hexdigest(),
        cubin_bytes=len(cubin),
        num_warps=launch["num_warps"],
        num_stages=launch["num_stages"],
        **_ptxas_figures(ptxas_log),
    )
    result["seconds"] = round(time.perf_counter() - t0, 3)
    return result


def _worker(jobs_path: str, out_path: str) -> None:
    """Subprocess entry: compile every (id, launch, capability) job; write {id: result} as JSON lines."""
    jobs = json.loads(Path(jobs_path).read_text())
    with open(out_path, "a") as out:
        for job in jobs:
            res = compile_one(job["launch"], job["capability"])
            out.write(json.dumps({"id": job["id"], "result": res}) + "\n")
            out.flush()


def cache_key(launch_key: str, capability: int, triton_version: str) -> str:
    return hashlib.sha256(f"{launch_key}|{capability}|{triton_version}".encode()).hexdigest()[:32]


def triton_version_at(path: str | None) -> str:
    """The Triton version a worker with ``path`` first on sys.path imports (without importing it here)."""
    code = "import importlib.metadata as m; print(m.version('triton'))"
    env = _worker_env(path)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def _worker_env(path: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the worker needs @triton.jit functions, not interpreted ones
    pkg_root = str(Path(__file__).resolve().parents[2])  # kernels/: so rz_kernels imports in the worker
    parts = (
        ([path] if path else []) + [pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("TRITON_CACHE_DIR", str(DEFAULT_CACHE / "triton"))
    return env


def compile_all(
    launches: dict[str, dict],
    capabilities: list[int],
    triton_path: str | None = None,
    cache_dir: Path = DEFAULT_CACHE,
    workers: int = 1,
    log=print,
) -> tuple[str, dict[tuple[str, int], dict]]:
    """Compile each distinct launch ({key: launch json}) for each capability with the Triton found first at
    ``triton_path`` (None: this interpreter's). Returns (triton version, {(key, capability): result})."""
    version = triton_version_at(triton_path)
    cache = Path(cache_dir) / f"triton-{version}"
    cache.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[str, int], dict] = {}
    jobs: list[dict] = []
    for key, launch in launches.items():
        for cap in capabilities:
            ck = cache_key(key, cap, version)
            hit = cache / f"{ck}.json"
            if hit.exists():
                results[(key, cap)] = json.loads(hit.read_text())
            else:
                jobs.append({"id": ck, "key": key, "launch": launch, "capability": cap})
    if jobs:
        log(f"triton {version}: compiling {len(jobs)} (launch, target) pairs ({len(results)} cached)")
        with tempfile.TemporaryDirectory() as d:
            procs, outs = [], []
            for w in range(max(1, workers)):
                part = jobs[w::workers]
                if not part:
                    continue
                jp, op = Path(d) / f"jobs{w}.json", Path(d) / f"out{w}.jsonl"
                jp.write_text(json.dumps(part))
                cmd = [sys.executable, "-m", "rz_kernels.compile_check.compile", str(jp), str(op)]
                procs.append(subprocess.Popen(cmd, env=_worker_env(triton_path)))
                outs.append(op)
            for p in procs:
                p.wait()
            by_id = {j["id"]: j for j in jobs}
            for op in outs:
                if not op.exists():
                    continue
                for line in op.read_text().splitlines():
                    row = json.loads(line)
                    job = by_id[row["id"]]
                    (cache / f"{row['id']}.json").write_text(json.dumps(row["result"]))
                    results[(job["key"], job["capability"])] = row["result"]
        for job in jobs:  # a worker that died: say so per launch instead of losing it
            results.setdefault(
                (job["key"], job["capability"]),
                {"ok": False, "error": "compile worker died", "triton": version},
            )
    return version, results


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
