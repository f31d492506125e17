#!/usr/bin/env bash
# The main job: installs everything, then trains the CPU demo agent. Extra arguments go to `rz train`
# (e.g. --run-dir runs/demo, steps=20).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec rz train demo "$@"
