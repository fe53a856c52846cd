"""The file manifest of a model directory: sha256 of every file, checked before the files are used.

The embedded default and every build of it record each file's sha256 in `warmstart.json`, so a
truncated clone, a Git LFS pointer or a partly written build fails at load with one line naming
the file. Checkpoints, which nest directories, use `tree_hashes`, `tree_sizes` and `tree_problems`.
Nothing is read through a symbolic link (`own_file`), and sizes are checked before hashing.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Mapping
from pathlib import Path, PurePosixPath

MANIFEST_FILE = "warmstart.json"


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def own_file(directory: Path, name: str) -> Path:
    """`directory / name`, reached without a symbolic link (a link's target could be /dev/zero):
    ValueError when `name` leaves `directory` or it or a folder on its way is a link."""
    relative = PurePosixPath(name)
    if not relative.parts or relative.is_absolute() or ".." in relative.parts or "\\" in name:
        raise ValueError(f"{name!r} is not a file name inside {directory}")
    path = directory
    for part in relative.parts:
        path = path / part
        if path.is_symlink():
            raise ValueError(f"{path} is a symbolic link: refused (a model directory's files must be its own)")
    return path


def verify_manifest(directory: Path) -> dict:
    """The manifest of `directory` after checking each recorded file's sha256; raises ValueError
    naming the first missing, changed or linked file (or a missing/unreadable/linked manifest).
    Nothing is read through a symbolic link (`own_file`)."""
    path = own_file(directory, MANIFEST_FILE)
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise ValueError(f"cannot read the model manifest {path}: {exc}") from exc
    recorded = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(recorded, dict) or not recorded:
        raise ValueError(f"{path} records no file hashes")
    for name, sha in recorded.items():
        file = own_file(directory, name)
        if not file.is_file():
            raise ValueError(f"{file} is missing (listed in {path.name})")
        actual = file_sha256(file)
        if actual != sha:
            raise ValueError(f"{file} does not match its recorded sha256 ({actual[:12]} != {sha[:12]}): "
                             "a partial checkout or a Git LFS pointer? reinstall, or rebuild with --rebuild")
    return manifest


def model_weights_sha256(directory: Path) -> str:
    """The sha256 the manifest of `directory` records for its weights, after checking every
    recorded file (`verify_manifest`): what a measurement of these weights is keyed by."""
    files = verify_manifest(directory)["files"]
    name = next((n for n in files if n.endswith(".safetensors")), None)
    if name is None:
        raise ValueError(f"{directory / MANIFEST_FILE} records no weights file")
    return files[name]


def tree_hashes(directory: Path, *, exclude: Collection[str] = ()) -> dict[str, str]:
    """sha256 of every regular file under `directory`, recursively, keyed by its POSIX path
    relative to `directory` (paths in `exclude` are left out); for checkpoints, which nest."""
    return {name: file_sha256(directory / name) for name in tree_sizes(directory, exclude=exclude)}


def tree_sizes(directory: Path, *, exclude: Collection[str] = ()) -> dict[str, int]:
    """Size in bytes of every regular file under `directory`, keyed as `tree_hashes` keys them."""
    return {path.relative_to(directory).as_posix(): path.stat().st_size for path in sorted(directory.rglob("*"))
            if path.is_file() and path.relative_to(directory).as_posix() not in exclude}


def links_leaving(directory: Path) -> list[str]:
    """Why each symbolic link under `directory` whose target (links followed) lies outside it is
    refused; empty when there is none. Links that stay inside are fine."""
    root = os.path.realpath(directory)
    problems = []
    for path in sorted(directory.rglob("*")):  # rglob does not descend into linked directories
        if path.is_symlink():
            target = os.path.realpath(path)
            if os.path.commonpath([root, target]) != root:
                problems.append(f"{path.relative_to(directory).as_posix()} is a link to {target}, outside {directory}")
    return problems


def _size_problem(name: str, size: int, recorded: int | None, max_bytes: int | None) -> str | None:
    if recorded is not None:
        return None if size == recorded else f"{name} is {size:,} bytes, its manifest records {recorded:,}"
    if max_bytes is not None and size > max_bytes:
        return (f"{name} is {size:,} bytes, over the {max_bytes:,} a file may have when its manifest records "
                "no sizes")
    return None


def tree_problems(directory: Path, recorded: Mapping[str, str], *, exclude: Collection[str] = (),
                  sizes: Mapping[str, int] | None = None, max_bytes: int | None = None) -> list[str]:
    """What differs between `directory` and the hashes `recorded` by `tree_hashes`: links out of
    it, missing, resized, changed (a bit flip) or unexpected files; empty when it is intact.

    A link out of `directory` is the only problem reported; sizes (`sizes`, else at most
    `max_bytes`) are checked from `stat` before anything is hashed, and nothing is hashed once one
    has failed."""
    if leaving := links_leaving(directory):
        return leaving
    sizes = sizes or {}
    problems = []
    present = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()} - set(exclude)
    for name in recorded:
        if name not in present:
            problems.append(f"{name} is missing")
        elif (problem := _size_problem(name, (directory / name).stat().st_size, sizes.get(name), max_bytes)) is not None:
            problems.append(problem)
    if not problems:
        problems.extend(f"{name} does not match its recorded sha256 ({(directory / name).stat().st_size} bytes now)"
                        for name, sha in recorded.items() if file_sha256(directory / name) != sha)
    problems.extend(f"{name} is not in the manifest" for name in sorted(present - set(recorded)))
    return problems
