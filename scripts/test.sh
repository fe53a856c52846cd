#!/usr/bin/env bash
# The project's test command (README, .ci/run): the whole suite in the project's virtualenv.
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=offline WEAVE_DISABLED=true HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Bytecode caches are written (git-ignored __pycache__/): the suite starts ~400 Python processes (MCP
# servers, launched ranks, commands) that import the package, and each worker rewrites every test
# module's asserts; where PYTHONDONTWRITEBYTECODE is set (some images set it) each did that again,
# run after run: a worker's collection 11.8 -> 7.5 CPU-s (2-core AMD EPYC, 2026-11-30).
unset PYTHONDONTWRITEBYTECODE
# Two workers (pytest-xdist): many tests wait on server processes and launched runs, so two share
# two cores well (13.7 -> 9.4 min on a 2-core VM, 2026-11-27). TEST_WORKERS=0 runs in one process.
workers=${TEST_WORKERS:-2}
# Each worker's torch (and every process it launches) gets its share of the cores. Two workers with
# an OpenMP pool of one thread per core each hold twice the cores' threads, and GNU OpenMP then wakes
# its workers through the kernel at every op (kernels/cpu_threads.py): six of the heaviest test files
# took 171 s that way and 85 s with one thread each (2-core AMD EPYC, 2026-11-28). A value already
# set is kept.
if [[ "$workers" =~ ^[1-9][0-9]*$ ]] && [ -z "${OMP_NUM_THREADS:-}" ]; then  # not for 0 or "auto"
  cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)  # Linux and macOS alike
  per_worker=$(( cores / workers ))
  export OMP_NUM_THREADS=$(( per_worker > 0 ? per_worker : 1 ))
fi
# Each test's seconds (setup + call + teardown) into a JUnit file in the run's output, and the 25
# slowest in the log's tail: benchmarks/bench_suite.py reads the file and flags any test over 30 s
# (issue 59: the suite must stay within 10 minutes on a slow 2-core VM, not only a fast one).
report=${TEST_REPORT:-outputs/tests/junit.xml}
mkdir -p "$(dirname "$report")"
# One module at a time to each worker, longest first (tests/conftest.py orders them by
# tests/module_seconds.json): both workers end together, and a module's fixtures (a launch shared by
# its tests) are built on one worker only. The default hands out chunks of ~115 tests in file order.
dist=()
if [ "$workers" != 0 ]; then dist=(--dist loadscope --no-loadscope-reorder); fi
exec .venv/bin/python -m pytest -q -n "$workers" ${dist[@]+"${dist[@]}"} --durations=25 --junitxml="$report" "$@"
