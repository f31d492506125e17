#!/usr/bin/env bash
# Make the venv mini-swe-agent runs from in `agent.kind: miniswe` runs (rz_agents/agents/miniswe/).
#
#   scripts/install_miniswe.sh [VENV]      # default: $RZ_MINISWE_VENV, else /work/venvs/miniswe
#
# mini-swe-agent is installed unmodified from the package index into its own venv: it pulls litellm,
# pandas, datasets and boto3, which stay out of rz's environment. rz runs it as a subprocess of this venv's
# python (agent.miniswe.python, $RZ_MINISWE_PYTHON, or VENV/bin/python). The tests that drive it
# (tests/agents/test_miniswe_agent.py) skip when the venv is absent.
set -euo pipefail
VENV="${1:-${RZ_MINISWE_VENV:-/work/venvs/miniswe}}"
VERSION="${MINISWE_VERSION:-2.4.6}"   # the version rz's shim and tests were written against
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet "mini-swe-agent==$VERSION"
MSWEA_GLOBAL_CONFIG_DIR="$(mktemp -d)" MSWEA_SILENT_STARTUP=1 "$VENV/bin/python" -c \
  "import minisweagent, minisweagent.run.mini; print('mini-swe-agent', minisweagent.__version__, 'in $VENV')"
