"""scripts/setup.sh on a fresh virtualenv: an installed torch (e.g. a CUDA build) is kept, never
swapped; a torch outside the project's range stops setup with one line; with no torch the pinned
CPU build is installed.

The real script runs the real pip on a throwaway copy of the project whose only dependency is the
project's own torch requirement (read from pyproject.toml). torch is faked: tiny local wheels named
torch with other versions (2.11.0+cu130 stands for a user's CUDA build, 2.13.0 for the newer build an
index offers), served from a local directory (no index, no network), so the test takes seconds."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: An in-tree PEP 517 backend: a wheel (editable or not) holding only metadata. It declares the
#: dependencies of the project's pyproject.toml, which is all pip resolves.
BACKEND = '''
import base64, hashlib, tomllib, zipfile

def _wheel(directory):
    project = tomllib.load(open("pyproject.toml", "rb"))["project"]
    meta = "Metadata-Version: 2.1\\nName: fakeproj\\nVersion: 0.1.0\\nProvides-Extra: dev\\n" + "".join(
        f"Requires-Dist: {d}\\n" for d in project["dependencies"])
    name = "fakeproj-0.1.0-py3-none-any.whl"
    files = {"fakeproj-0.1.0.dist-info/METADATA": meta,
             "fakeproj-0.1.0.dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: fake\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},{len(t)}\\n"
                     for p, t in files.items()) + "fakeproj-0.1.0.dist-info/RECORD,,\\n"
    with zipfile.ZipFile(f"{directory}/{name}", "w") as z:
        for p, t in {**files, "fakeproj-0.1.0.dist-info/RECORD": record}.items():
            z.writestr(p, t)
    return name

def get_requires_for_build_wheel(config_settings=None): return []
def get_requires_for_build_editable(config_settings=None): return []
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None): return _wheel(wheel_directory)
def build_editable(wheel_directory, config_settings=None, metadata_directory=None): return _wheel(wheel_directory)
'''


def _fake_torch_wheel(directory: Path, version: str) -> Path:
    files = {"torch/__init__.py": f"__version__ = {version!r}\n",
             f"torch-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
             f"torch-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: fake\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},{len(t)}\n"
                     for p, t in files.items()) + f"torch-{version}.dist-info/RECORD,,\n"
    path = directory / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, t in {**files, f"torch-{version}.dist-info/RECORD": record}.items():
            z.writestr(p, t)
    return path


@pytest.fixture(scope="module")
def offline_pip(tmp_path_factory) -> tuple[dict[str, str], Path]:
    """Environment for pip that sees only a local directory of fake torch wheels, and that directory."""
    wheels = tmp_path_factory.mktemp("wheels")
    for version in ("2.11.0+cu130", "2.13.0", "2.10.0"):
        _fake_torch_wheel(wheels, version)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels),
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1")
    return env, wheels


def _project(root: Path) -> Path:
    """A throwaway copy of the project for setup.sh: its script and constraints, and a pyproject
    whose only dependency is the real project's torch requirement."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_req = next(d for d in deps if d.replace(" ", "").startswith(("torch>", "torch=", "torch<", "torch~")))
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", root / "scripts")
    shutil.copy(REPO / "constraints.txt", root)
    (root / "fakebackend.py").write_text(BACKEND)
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "fakebackend"\nbackend-path = ["."]\n\n'
        f'[project]\nname = "fakeproj"\nversion = "0.1.0"\ndependencies = ["{torch_req}"]\n')
    return root


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory, offline_pip) -> Path:
    """A fresh virtualenv (pip in it, nothing else), made once: each test gets a copy (`_venv`).
    Making one runs ensurepip, ~2.5 s of CPU each time; a copy is the same files (its python
    is a link to the base interpreter, and it finds its prefix from where it lies)."""
    template = tmp_path_factory.mktemp("venv") / ".venv"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(template)], check=True, capture_output=True,
                       timeout=120, env=offline_pip[0])
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        pytest.skip(f"cannot create a virtualenv here: {exc}")
    return template


def _venv(root: Path, fresh: Path) -> Path:
    """`root/.venv`: a copy of the fresh virtualenv `fresh`; its python."""
    shutil.copytree(fresh, root / ".venv", symlinks=True)
    return root / ".venv" / "bin" / "python"


def _torch_in(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                          capture_output=True, text=True, timeout=60).stdout.strip()


def _setup(root: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(root / "scripts" / "setup.sh")], capture_output=True, text=True,
                          timeout=300, env={**env, "PYTHON": sys.executable})


def test_setup_keeps_an_installed_cuda_torch_and_refuses_one_outside_the_range(tmp_path, offline_pip, fresh_venv):
    env, wheels = offline_pip
    root = _project(tmp_path / "proj")
    python = _venv(root, fresh_venv)
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheels / "torch-2.11.0+cu130-py3-none-any.whl")],
                   check=True, env=env, timeout=120)
    done = _setup(root, env)
    assert done.returncode == 0, done.stdout + done.stderr
    # a newer torch (2.13.0) was on offer; the user's CUDA build stays (before: swapped for 2.13.0)
    assert _torch_in(python) == "2.11.0+cu130"
    assert "setup ok: torch 2.11.0+cu130 kept" in done.stdout, done.stdout
    assert subprocess.run([str(python), "-m", "pip", "show", "-q", "fakeproj"], env=env).returncode == 0

    subprocess.run([str(python), "-m", "pip", "install", "-q", "--force-reinstall",
                    str(wheels / "torch-2.10.0-py3-none-any.whl")], check=True, env=env, timeout=120)
    done = _setup(root, env)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode != 0 and len(errors) == 1 and "torch 2.10.0" in errors[0], done.stderr
    assert _torch_in(python) == "2.10.0"  # left as it was


def test_setup_installs_the_pinned_cpu_torch_only_when_none_is_installed(tmp_path, offline_pip, fresh_venv):
    env, _ = offline_pip
    root = _project(tmp_path / "proj")
    python = _venv(root, fresh_venv)
    done = _setup(root, {**env, "TORCH_VERSION": "2.13.0"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert _torch_in(python) == "2.13.0" and "torch 2.13.0 installed" in done.stdout, done.stdout
    default = (REPO / "scripts" / "setup.sh").read_text()
    assert 'TORCH_VERSION:-2.13.0' in default and "download.pytorch.org/whl/cpu" in default


class _Index:
    """A local 'PyTorch index' on 127.0.0.1: `dead` accepts connections and never answers (a firewall
    that drops packets looks the same to a client); otherwise it answers 200 to every GET. Counts
    the connections it gets."""

    def __init__(self, dead: bool) -> None:
        import socket
        import threading

        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/whl/cpu"
        self.held: list = []

        def serve() -> None:
            while True:
                try:
                    conn, _ = self.sock.accept()
                except OSError:
                    return
                self.connections += 1
                if dead:
                    self.held.append(conn)
                else:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
                    conn.close()

        threading.Thread(target=serve, daemon=True).start()

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.mark.parametrize("dead", [True, False], ids=["index-silent", "index-answers"])
def test_setup_asks_the_torch_index_once_and_falls_back_when_it_is_silent(tmp_path, offline_pip, fresh_venv, dead):
    """One reachability request with a short timeout; a silent index is never handed to pip (before:
    pip retried it five times for every package, minutes behind a firewall)."""
    env, _ = offline_pip
    root = _project(tmp_path / "proj")
    python = _venv(root, fresh_venv)
    index = _Index(dead)
    try:
        env = {**env, "TORCH_VERSION": "2.13.0", "TORCH_INDEX_URL": index.url, "TORCH_INDEX_TIMEOUT": "1"}
        # pip may use indexes here (only setup.sh's choice keeps it off the silent one); its
        # configured index is an empty local one, the wheels come from find-links
        (tmp_path / "mirror").mkdir()
        env.pop("PIP_NO_INDEX")
        env.update(PIP_INDEX_URL=(tmp_path / "mirror").as_uri(), PIP_DEFAULT_TIMEOUT="2")
        done = _setup(root, env)
    finally:
        index.close()
    assert done.returncode == 0, done.stdout + done.stderr
    assert _torch_in(python) == "2.13.0"
    note = [line for line in done.stdout.splitlines() if line.startswith("note:")]
    if dead:  # one request, then never again (before: pip's retries of every request)
        assert index.connections == 1, index.connections
        assert len(note) == 1 and index.url in note[0] and "did not answer in 1 s" in note[0], done.stdout
        assert "torch 2.13.0 installed (from pip's configured index)" in done.stdout, done.stdout
    else:
        assert not note and f"torch 2.13.0 installed (CPU build, from {index.url})" in done.stdout, done.stdout


@pytest.mark.parametrize("venv_first", [False, True], ids=["no-venv", "venv-with-torch"])
def test_setup_names_the_python_it_needs_in_one_line(tmp_path, offline_pip, venv_first, request):
    """A Python older than pyproject.toml's requires-python ends setup in one `error:` line naming the
    version needed (before: pip's ResolutionImpossible for torch, or a `tomllib` traceback). The
    project copy here asks for Python >=3.99, so the Python running this test is the old one."""
    env, wheels = offline_pip
    root = _project(tmp_path / "proj")
    if venv_first:  # the GPU user's path: .venv made, a torch in it
        python = _venv(root, request.getfixturevalue("fresh_venv"))
        subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheels / "torch-2.11.0+cu130-py3-none-any.whl")],
                       check=True, env=env, timeout=120)
    text = (root / "pyproject.toml").read_text().replace('version = "0.1.0"\n', 'version = "0.1.0"\nrequires-python = ">=3.99"\n')
    (root / "pyproject.toml").write_text(text)
    done = _setup(root, env)
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert errors[0].startswith("error:") and "needs Python >=3.99" in errors[0], errors
    assert (root / ".venv").is_dir() == venv_first  # nothing made for the wrong Python
