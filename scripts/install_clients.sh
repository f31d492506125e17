#!/usr/bin/env bash
# The agent frameworks tests/serve/test_serve_client_frameworks.py runs against `rz serve`, in a venv of their
# own (no torch; they never share rz's Python): the openai SDK, LangChain's OpenAI chat model, litellm,
# smolagents and the OpenAI Agents SDK. Idempotent: an existing venv with these versions is left as it is.
#
#   bash scripts/install_clients.sh            # at $RZ_CLIENTS_VENV (default /work/venvs/clients)
set -euo pipefail
VENV=${RZ_CLIENTS_VENV:-/work/venvs/clients}
PY=${PYTHON:-python3}
PKGS=(openai==3.63.0 langchain-openai==1.8.1 litellm==1.110.2 smolagents==1.26.0 openai-agents==0.24.0)
if [ -x "$VENV/bin/python" ]; then
  have=$("$VENV/bin/python" -m pip freeze 2>/dev/null || true)
  missing=0
  for pkg in "${PKGS[@]}"; do
    grep -qix "$pkg" <<<"$have" || missing=1
  done
  [ "$missing" = 0 ] && exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "${PKGS[@]}"
