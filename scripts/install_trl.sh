#!/usr/bin/env bash
# TRL for bench/vs_trl.py, in a venv of its own that shares this machine's torch 2.13 / transformers 5.19
# (--system-site-packages: trl 1.16 pins neither; pip adds datasets, pandas, pyarrow there, not here).
# Not part of scripts/install.sh: only the rz-vs-TRL bench needs it. Idempotent.
#
#   bash scripts/install_trl.sh           # at $RZ_TRL_VENV (default /work/venvs/trl)
set -euo pipefail
VENV=${RZ_TRL_VENV:-/work/venvs/trl}
PY=${PYTHON:-python3}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import trl; assert trl.__version__ == '1.16.0'" 2>/dev/null; then
  exit 0
fi
"$PY" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q "trl==1.16.0"
