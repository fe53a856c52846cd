#!/usr/bin/env bash
# One-time setup (idempotent): a virtualenv in .venv with torch and the project installed (editable,
# with the `skyrl-tool-agent` command in .venv/bin), dependencies at constraints.txt's tested versions.
#
# torch: an installed one is kept and never swapped: install the CUDA build for your driver into .venv
# first (README, "Quick start"), then run this. It must satisfy pyproject.toml's range (else this stops
# with one line); the project is installed with that exact torch pinned, so pip cannot replace it.
# With no torch in .venv, the CPU build of torch $TORCH_VERSION (default 2.13.0, the CPU path's tested
# version) comes from $TORCH_INDEX_URL (default PyTorch's CPU index; an unpinned torch would pull a
# multi-GB CUDA build on Linux). That index is asked once, with a ${TORCH_INDEX_TIMEOUT:-5} s timeout: when it
# does not answer (a firewall, a local mirror), torch comes from pip's configured index instead, in one
# try per package (never pip's five retries of a dead index for every dependency).
#
# SETUP_EXTRAS (default dev: the tests, DeepSpeed, bitsandbytes, TRL) chooses the extras installed: a
# GPU user who trains LoRA or QLoRA takes SETUP_EXTRAS=qlora and never builds DeepSpeed; full mode
# takes SETUP_EXTRAS=deepspeed (or deepspeed,qlora).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The Python the project needs (pyproject.toml's requires-python), checked before anything is made.
python_ok() {
  "$1" - <<'PY'
import re, sys
spec = re.search(r'^requires-python\s*=\s*">=\s*([0-9.]+)"', open("pyproject.toml").read(), re.M)
need = tuple(int(x) for x in spec.group(1).split(".")) if spec else (3,)
if sys.version_info[:len(need)] < need:
    sys.exit(f"error: {sys.executable} is Python {sys.version.split()[0]}; this project needs Python >={spec.group(1)} "
             "(pyproject.toml): run again with PYTHON=/path/to/python3.11 (and remove .venv if it was made by the old one)")
PY
}
check_python() {  # one `error:` line (exit 2) for a Python too old, or none at all
  local said line
  said=$(python_ok "$1" 2>&1) && return 0
  line=$(printf '%s\n' "$said" | grep -m1 '^error:') || line="error: cannot run $1 as Python 3 (set PYTHON=/path/to/python3.11)"
  echo "$line" >&2
  exit 2
}
if [ ! -x .venv/bin/python ]; then
  command -v "$PY" >/dev/null 2>&1 || { echo "error: no $PY on PATH; set PYTHON=/path/to/python3.11" >&2; exit 2; }
  check_python "$PY"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
check_python "$VPY"
torch_installed() { "$VPY" -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null; }
torch_version=$(torch_installed || true)
if [ -z "$torch_version" ]; then
  torch_index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
  if "$VPY" - "$torch_index" "${TORCH_INDEX_TIMEOUT:-5}" <<'PY'
import sys, urllib.request
try:  # one request, a short timeout: is the index there at all?
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=float(sys.argv[2])).close()
except Exception:
    sys.exit(1)
PY
  then
    "$VPY" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}" --index-url "$torch_index"
    torch_how="installed (CPU build, from $torch_index)"
  else
    echo "note: $torch_index did not answer in ${TORCH_INDEX_TIMEOUT:-5} s; torch ${TORCH_VERSION:-2.13.0} from pip's configured index instead (on Linux PyPI's build is the CUDA one)"
    "$VPY" -m pip install -q --retries 0 "torch==${TORCH_VERSION:-2.13.0}"
    torch_how="installed (from pip's configured index)"
  fi
  torch_version=$(torch_installed)
else
  torch_how="kept (already installed)"
fi
# The installed torch must be in the project's range: say so now rather than let pip swap it.
"$VPY" - "$torch_version" <<'PY'
import sys, tomllib
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.version import Version
wanted = next(Requirement(r) for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
              if Requirement(r).name == "torch")
if not wanted.specifier.contains(Version(sys.argv[1]), prereleases=True):
    sys.exit(f"error: .venv holds torch {sys.argv[1]}, outside the project's {wanted} (pyproject.toml); "
             "install a torch in that range into .venv (README, Quick start), then run this again")
PY
extras=${SETUP_EXTRAS:-dev}
stamp=.venv/.installed-$( (cat pyproject.toml constraints.txt; echo "$torch_version $extras") | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  pin=$(mktemp)
  trap 'rm -f "$pin"' EXIT
  echo "torch==$torch_version" > "$pin"  # the torch in .venv stays exactly as it is
  "$VPY" -m pip install -q -e ".[$extras]" -c constraints.txt -c "$pin"
  touch "$stamp"
fi
echo "setup ok: torch $torch_version $torch_how | $("$VPY" -c '
import importlib.metadata as m
def v(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return "missing"
print("transformers", v("transformers"), "| mcp", v("mcp"))')"
