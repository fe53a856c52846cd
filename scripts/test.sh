#!/usr/bin/env bash
# The project's test command (README, .ci/run): the whole suite in the project's virtualenv.
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=offline WEAVE_DISABLED=true HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -q "$@"
