#!/usr/bin/env bash
# The test command: installs what is missing, then runs the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${PYTHON:-python3}" -m pytest -q "$@"
