#!/usr/bin/env bash
# The project's test command (README, .ci/run): the whole suite in the project's virtualenv.
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=offline WEAVE_DISABLED=true HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Two workers (pytest-xdist): many tests wait on server processes and launched runs, so two share
# two cores well (13.7 -> 9.4 min on a 2-core VM, 2026-11-27). TEST_WORKERS=0 runs in one process.
exec .venv/bin/python -m pytest -q -n "${TEST_WORKERS:-2}" "$@"
