"""A child process that runs math-verify with its own (signal-based) timeouts disabled.

math-verify's timeouts use SIGALRM, which only works in the main thread; the parent bounds each
request itself and kills this process when it takes too long. Protocol: one JSON object per line
on stdin (``{"gold": str, "pred": str}``), one per line on stdout (``{"equal": bool, "error": ...}``).
"""

from __future__ import annotations

import json
import logging
import sys


def main() -> None:
    """Answer equivalence requests until stdin closes."""
    try:  # die with the parent (PR_SET_PDEATHSIG), even in the middle of a long computation
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    logging.disable(logging.WARNING)  # math-verify warns on every call that timeouts are disabled
    from math_verify import parse, verify

    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints from libraries must not corrupt the protocol
    print(json.dumps({"ready": True}), file=out, flush=True)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            gold = parse(f"\\boxed{{{req['gold']}}}", parsing_timeout=None)
            pred = parse(f"\\boxed{{{req['pred']}}}", parsing_timeout=None)
            reply = {"equal": bool(gold and pred and verify(gold, pred, timeout_seconds=None)), "error": None}
        except Exception as exc:  # noqa: BLE001 - a bad answer is "not equal", never a crash
            reply = {"equal": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        print(json.dumps(reply), file=out, flush=True)


if __name__ == "__main__":
    main()
