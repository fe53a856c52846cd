#!/usr/bin/env bash
# One-time setup (idempotent): a virtualenv in .venv with a CPU torch and the project installed
# (editable, with the `skyrl-tool-agent` command in .venv/bin).
# GPU users: create the venv, install the CUDA torch for your driver first
#   (e.g. `.venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cu124`),
#   then run this script; it keeps an installed torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build on a CPU machine.
if ! "$VPY" -c "import torch" 2>/dev/null; then
  "$VPY" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
fi
# The project and its dev extras at the tested versions (constraints.txt pins them; torch excluded).
stamp=.venv/.installed-$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  "$VPY" -m pip install -q -e ".[dev]" -c constraints.txt
  touch "$stamp"
fi
echo "setup ok: $("$VPY" -c 'import torch, transformers, mcp; print("torch", torch.__version__, "| transformers", transformers.__version__)')"
