"""The file manifest of a model directory: sha256 of every file, checked before the files are used.

The embedded default ships in the package (`skyrl_tool_agent/assets/embedded`) with its
`warmstart.json` recording each file's sha256. A truncated clone, a Git LFS pointer in place of
the weights or a hand-edited file then fails at load with one line naming the file, instead of
training from wrong weights.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST_FILE = "warmstart.json"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def directory_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every regular file in `directory` except the manifest itself, by file name."""
    return {p.name: file_sha256(p) for p in sorted(directory.iterdir()) if p.is_file() and p.name != MANIFEST_FILE}


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
