#!/usr/bin/env bash
# The one device call of scripts/gpu_check.py (issue 54): fits the device machine's 600 s per-call limit with
# cold Triton JIT (the script's own budget is 520 s; `timeout` stops it at 575 s whatever happens) and returns
# ONE file: $OUT/gpu_check.json. Triton's cache and the working copy of the results stay under runs/ (a
# device call returns only a few files of $OUT; hundreds of cache files there could push the JSON out).
#
#   OUT=$OUT bash scripts/gpu_check_device.sh            # first call
#   OUT=$OUT bash scripts/gpu_check_device.sh --resume   # at once after it (the machine stays warm ~30 s):
#                                                        # reruns only the sections the first call cut
#   OUT=/tmp/o bash scripts/gpu_check_device.sh --dry-run --only env   # the same command on CPU
#
# On a fresh machine, --resume needs the first call's file: put the returned gpu_check.json at
# runs/gpu_check.json and carry runs/gpu_check.json with the call. Other arguments go to gpu_check.py.
# GPU_CHECK_RUNS moves runs/ (tests); TRITON_CACHE_DIR, if set, is kept.
set -u
: "${OUT:?set OUT to the folder the device call returns}"
cd "$(dirname "$0")/.."
RUNS="${GPU_CHECK_RUNS:-runs}"
mkdir -p "$RUNS" "$OUT"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$(cd "$RUNS" && pwd)/triton-cache}"
timeout -k 10 575 "${PYTHON:-python3}" -u scripts/gpu_check.py --out "$RUNS/gpu_check.json" "$@"
rc=$?
if [ -f "$RUNS/gpu_check.json" ]; then
    cp "$RUNS/gpu_check.json" "$OUT/gpu_check.json"
else
    echo "[gpu_check_device] no results file was written (exit $rc)"
fi
exit $rc
