"""The file manifest of a model directory: sha256 of every file, checked before the files are used.

The embedded default ships in the package (`skyrl_tool_agent/assets/embedded`) with its
`warmstart.json` recording each file's sha256, and so does every build of it (into a cache or
`model.embedded_dir`). A truncated clone, a Git LFS pointer in place of the weights, a hand-edited
file or a partly written build then fails at load with one line naming the file, instead of
training from wrong weights. Checkpoints, which nest directories, use `tree_hashes` and
`tree_problems` the same way (`skyrl_tool_agent.grpo.checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from pathlib import Path

MANIFEST_FILE = "warmstart.json"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_manifest(directory: Path) -> dict:
    """The manifest of `directory` after checking each recorded file's sha256; raises ValueError
    naming the first missing or changed file (or a missing/unreadable manifest)."""
    path = directory / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the model manifest {path}: {exc}") from exc
    recorded = manifest.get("files")
    if not isinstance(recorded, dict) or not recorded:
        raise ValueError(f"{path} records no file hashes")
    for name, sha in recorded.items():
        file = directory / name
        if not file.is_file():
            raise ValueError(f"{file} is missing (listed in {path.name})")
        actual = file_sha256(file)
        if actual != sha:
            raise ValueError(f"{file} does not match its recorded sha256 ({actual[:12]} != {sha[:12]}): "
                             "a partial checkout or a Git LFS pointer? reinstall, or rebuild with --rebuild")
    return manifest


def tree_hashes(directory: Path, *, exclude: Collection[str] = ()) -> dict[str, str]:
    """sha256 of every regular file under `directory`, recursively, keyed by its POSIX path
    relative to `directory` (paths in `exclude` are left out); for checkpoints, which nest."""
    hashes = {}
    for path in sorted(directory.rglob("*")):
        name = path.relative_to(directory).as_posix()
        if path.is_file() and name not in exclude:
            hashes[name] = file_sha256(path)
    return hashes


def tree_problems(directory: Path, recorded: Mapping[str, str], *, exclude: Collection[str] = ()) -> list[str]:
    """What differs between `directory` and the hashes `recorded` by `tree_hashes`: missing,
    changed (a bit flip, a truncation) or unexpected files; empty when it is intact."""
    problems = []
    present = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()} - set(exclude)
    for name, sha in recorded.items():
        file = directory / name
        if name not in present:
            problems.append(f"{name} is missing")
        elif file_sha256(file) != sha:
            problems.append(f"{name} does not match its recorded sha256 ({file.stat().st_size} bytes now)")
    problems.extend(f"{name} is not in the manifest" for name in sorted(present - set(recorded)))
    return problems
