"""The CPU floor of a reset that involves Chromium, against the per-reset budget a density goal implies.

    python bench/chromium_floor.py [--repeats 5] [--json]

Issue 44 asks for a reset p50 of <= 3 s with 16 Chromium desktops and <= 6 s with 32, on 2 cores.
In the lockstep bench (``bench/osworld.py --concurrent``) every desktop resets at once, so the
resets share the cores: the goal allows ``cores * p50 / desktops`` CPU seconds per reset for all
of a reset's work (0.375 CPU-s at 16 and at 32 desktops on 2 cores). This bench measures the
cheapest Chromium operation each kind of reset must contain, on one private Xvfb, nothing else:

- ``start``: a Chromium started with the env's own command line (``chrome.chromium_command``) on an
  empty profile, to its DevTools endpoint and its first page loaded, plus 1 s to settle: what a
  fresh reset pays before the task's setup, the observation or any cleaning.
- ``start_single_process``: the same with ``--single-process`` (all of Chromium in one process;
  unsupported by Chromium, measured only to bound what fewer processes could save).
- ``new_window_cdp``: in a running Chromium, a window opened over DevTools (``Target.createTarget``
  with ``newWindow``, as the kept-browser reset opens the task's window): the floor of a reset that
  keeps the browser, before any of its cleaning.
- ``new_window_launcher``: the same window opened the way a task's ``google-chrome URL`` does (a
  second process hands its command line to the running one and exits).
- ``new_profile_window``: in a running Chromium, a window on a new profile directory (a clean
  profile without a restart): the floor of a reset that swaps profiles instead of cleaning one.

CPU is every process this bench starts (reaped ones included, ``osworld_profile.CpuSampler``), so
other jobs on the machine are not counted; contention still inflates it a little. Chromium's own
figures are medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from rz_agents.envs.osworld.cdp import CdpClient
from rz_agents.envs.osworld.chrome import LOCAL_STATE_DEFAULTS, chromium_binary, chromium_command

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from osworld_profile import CpuSampler, host_pids  # noqa: E402 - the bench folder is not a package

GOALS = ((16, 3.0), (32, 6.0))  # (desktops, reset p50 goal in s), issue 44
CORES = 2
PORT = 9391
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # a proxy is never for localhost


def _chromium_cpu(sampler: CpuSampler) -> float:
    """CPU seconds of the sampled Chromium processes and launchers (the bench and Xvfb left out)."""
    return sum(v for k, v in sampler.by_kind().items() if not k.startswith(("host:", "python", "Xvfb")))


def _devtools(path: str, timeout_s: float = 20.0) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with _NO_PROXY.open(f"http://127.0.0.1:{PORT}{path}", timeout=1) as r:
                return json.load(r)
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Chromium's DevTools did not answer {path} in {timeout_s} s") from None
            time.sleep(0.05)


def _wait_pages(count: int, timeout_s: float = 20.0) -> None:
    """Until ``count`` page targets exist and none is still loading about:blank's predecessor."""
    deadline = time.monotonic() + timeout_s
    while sum(t.get("type") == "page" for t in _devtools("/json/list")) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"Chromium did not open page {count} in {timeout_s} s")
        time.sleep(0.05)


def _profile(root: str, name: str) -> str:
    path = tempfile.mkdtemp(prefix=name + "-", dir=root)  # a new one each time: a killed Chromium's
    # crash handler may still write into the last
    with open(os.path.join(path, "Local State"), "w") as f:
        json.dump(LOCAL_STATE_DEFAULTS, f)
    return path


def _start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()  # the profile is thrown away: no graceful shutdown to pay for
    proc.wait()


def measure_start(binary: str, root: str, env: dict[str, str], extra: list[str]) -> float:
    """CPU-s of one Chromium start on an empty profile, to its first page plus 1 s."""
    cmd = chromium_command(binary, PORT, _profile(root, "start"), extra) + ["about:blank"]
    with CpuSampler(host_pids) as sampler:
        proc = _start(cmd, env)
        _devtools("/json/version")
        _wait_pages(1)
        time.sleep(1.0)
    cpu = _chromium_cpu(sampler)
    _stop(proc)
    return cpu


def measure_windows(binary: str, root: str, env: dict[str, str], repeats: int) -> dict[str, list[float]]:
    """CPU-s of a new window, and of a window on a new profile, in one running Chromium."""
    profile = _profile(root, "running")
    base = chromium_command(binary, PORT, profile)
    proc = _start(base + ["about:blank"], env)
    out: dict[str, list[float]] = {"new_window_cdp": [], "new_window_launcher": [], "new_profile_window": []}
    try:
        _devtools("/json/version")
        _wait_pages(1)
        time.sleep(2.0)
        pages = 1
        cdp = CdpClient(f"http://127.0.0.1:{PORT}")
        for i in range(repeats):
            for name, extra in (
                ("new_window_cdp", None),
                ("new_window_launcher", []),
                ("new_profile_window", [f"--profile-directory=ep{i}"]),
            ):
                with CpuSampler(host_pids) as sampler:
                    if extra is None:
                        cdp.send("Target.createTarget", {"url": "about:blank", "newWindow": True})
                    else:
                        cmd = base + extra + ["about:blank"]
                        subprocess.run(cmd, env=env, capture_output=True, timeout=30)
                    pages += 1
                    _wait_pages(pages)
                    time.sleep(1.0)
                out[name].append(_chromium_cpu(sampler))
        cdp.close()
    finally:
        _stop(proc)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    binary = chromium_binary()
    if binary is None or shutil.which("Xvfb") is None:
        print("needs Chromium and Xvfb (scripts/install.sh installs both)", file=sys.stderr)
        return 2
    root = tempfile.mkdtemp(prefix="rz-chromium-floor-")
    display = f":{200 + os.getpid() % 500}"
    xvfb = subprocess.Popen(
        ["Xvfb", display, "-screen", "0", "1920x1080x24", "-noreset", "-nolisten", "tcp"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = dict(os.environ, DISPLAY=display, HOME=root)
    try:
        time.sleep(1.0)
        runs: dict[str, list[float]] = {"start": [], "start_single_process": []}
        for _ in range(args.repeats):
            runs["start"].append(measure_start(binary, root, env, []))
            runs["start_single_process"].append(measure_start(binary, root, env, ["--single-process"]))
        runs.update(measure_windows(binary, root, env, args.repeats))
    finally:
        xvfb.terminate()
        xvfb.wait()
        shutil.rmtree(root, ignore_errors=True)
    budgets = {f"{n} desktops, p50 <= {p50:g} s": CORES * p50 / n for n, p50 in GOALS}
    row = {
        "cpu_s_median": {k: round(statistics.median(v), 3) for k, v in runs.items()},
        "cpu_s_all": {k: [round(x, 3) for x in v] for k, v in runs.items()},
        "budget_cpu_s_per_reset": budgets,
        "cores": CORES,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if args.json:
        print(json.dumps(row))
        return 0
    print(f"per-reset budget of the goal on {CORES} cores (all desktops resetting at once):")
    for name, b in budgets.items():
        print(f"  {name}: {b:.3f} CPU-s")
    tight = min(budgets.values())
    print("Chromium's floor per reset kind (median CPU-s, the floor / the tightest budget):")
    for k, v in row["cpu_s_median"].items():
        print(f"  {k:<22} {v:.3f}  ({v / tight:.2f}x)")
    print(f"load average {row['load_avg_1m']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
