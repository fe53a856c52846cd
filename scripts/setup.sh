#!/usr/bin/env bash
# One-time setup (idempotent): a virtualenv in .venv with torch and the project installed (editable,
# with the `skyrl-tool-agent` command in .venv/bin), dependencies at constraints.txt's tested versions.
#
# torch: an installed one is kept and never swapped: install the CUDA build for your driver into .venv
# first (README, "Quick start"), then run this. It must satisfy pyproject.toml's range (else this stops
# with one line); the project is installed with that exact torch pinned, so pip cannot replace it.
# With no torch in .venv, the CPU build of torch $TORCH_VERSION (default 2.13.0, the CPU path's tested
# version) comes from $TORCH_INDEX_URL (default PyTorch's CPU index; an unpinned torch would pull a
# multi-GB CUDA build on Linux).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
torch_installed() { "$VPY" -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null; }
torch_version=$(torch_installed || true)
if [ -z "$torch_version" ]; then
  "$VPY" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}" --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
  torch_version=$(torch_installed)
  torch_how="installed (CPU build)"
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
stamp=.venv/.installed-$( (cat pyproject.toml constraints.txt; echo "$torch_version") | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  pin=$(mktemp)
  trap 'rm -f "$pin"' EXIT
  echo "torch==$torch_version" > "$pin"  # the torch in .venv stays exactly as it is
  "$VPY" -m pip install -q -e ".[dev]" -c constraints.txt -c "$pin"
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
