"""Env calls run the way the rollout runs them (``call_env`` on a thread pool): concurrently and off the
event loop, hundreds of sandboxed episodes at once, nothing leaked."""

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from sandbox_test_support import FAST

from rz_agents.envs.python_tool import PythonToolEnv
from rz_agents.envs.tool_calls import format_tool_call
from rz_agents.rewards import MathVerifier
from rz_agents.rollout.agent_loop import call_env


def sandbox_processes() -> set[int]:
    """Our descendant processes that belong to a sandbox (bwrap, or running as a sandbox uid).

    Only descendants: other test runs on the same machine may have sandboxes of their own.
    """
    parent, info = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        parent[int(name)] = int(fields["PPid"])
        info[int(name)] = int(fields["Uid"].split()[0]) >= 2_000_000 or b"bwrap" in cmd

    def descends_from_us(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    return {pid for pid, is_sandbox in info.items() if is_sandbox and descends_from_us(pid)}


async def episode(pool: ThreadPoolExecutor, env: PythonToolEnv, i: int) -> float:
    task = {"id": f"t{i}", "question": f"Compute {i}*7.", "answer": str(i * 7)}
    await call_env(pool, env.reset, options={"task": task})
    obs, *_ = await call_env(pool, env.step, format_tool_call("python", {"code": f"print({i}*7)"}))
    assert obs == [{"role": "tool", "content": str(i * 7)}]
    _, reward, terminated, _, _ = await call_env(pool, env.step, rf"\boxed{{{obs[0]['content']}}}")
    assert terminated
    await call_env(pool, env.close)
    return reward


def test_env_calls_run_concurrently_on_worker_threads():
    # each call waits until 8 calls wait together: it completes only if 8 run at once, off the loop thread
    barrier = threading.Barrier(8, timeout=60)
    seen = set()

    def blocking_call(i: int) -> int:
        seen.add(threading.get_ident())
        barrier.wait()
        return i

    async def main() -> list[int]:
        with ThreadPoolExecutor(8) as pool:
            return await asyncio.gather(*(call_env(pool, blocking_call, i) for i in range(8)))

    loop_thread = threading.get_ident()
    assert asyncio.run(main()) == list(range(8))
    assert len(seen) == 8 and loop_thread not in seen


def test_hundreds_of_concurrent_episodes_without_leaking_processes():
    n = 200
    before = sandbox_processes()
    verifier = MathVerifier()

    async def main() -> list[float]:
        with ThreadPoolExecutor(32, thread_name_prefix="rz-env") as pool:  # as the rollout controller does
            envs = [PythonToolEnv(limits=FAST, verifier=verifier) for _ in range(n)]
            return await asyncio.gather(*(episode(pool, env, i) for i, env in enumerate(envs)))

    start = time.monotonic()
    rewards = asyncio.run(main())
    elapsed = time.monotonic() - start
    verifier.close()
    assert rewards == [1.0] * n
    # killed sandboxes take a moment to exit under load; none may remain after that
    deadline = time.monotonic() + 30
    while sandbox_processes() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    left = sandbox_processes() - before
    assert not left, f"sandbox processes left behind: {sorted(left)}"
    print(f"{n} episodes in {elapsed:.1f}s")
