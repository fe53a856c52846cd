"""Copies of what an MCP server may write, and the server pointed at them (`IsolatedServer`).

A server given `writable_paths` is never handed its originals: whatever names one is pointed at a
copy (`point_at`), made in place (`copy_state`) and digested (`state_digest`). Every copy lives
under the run's directory (`mcp.reaper`), removed when the run ends however it ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from skyrl_tool_agent.config.env import MCPServerConfig
from skyrl_tool_agent.config.errors import UserInputError

#: SQLite keeps committed pages beside the database in these files; a copy takes them along.
_SQLITE_SIDECARS = ("-wal", "-journal")
_SQLITE_HEADER = b"SQLite format 3\x00"


def _is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(16) == _SQLITE_HEADER
    except OSError:
        return False


def copy_state(source: Path, target: Path) -> None:
    """Make `target` hold what `source` holds, in place (a server may have `target` open): a SQLite
    database through the backup API (source read-only), another file over `target`'s bytes, a
    directory emptied and filled again."""
    if source.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        for child in list(target.iterdir()):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if _is_sqlite(source):
        with contextlib.closing(sqlite3.connect(f"file:{source}?mode=ro", uri=True)) as src, \
                contextlib.closing(sqlite3.connect(target)) as dst:
            src.backup(dst)
        return
    shutil.copyfile(source, target)


def state_digest(paths: Sequence[Path]) -> str:
    """A digest of what `paths` hold (a file with its SQLite journal and WAL, a directory's files by
    name): equal digests, equal state, so unchanged files are neither saved nor restored."""
    digest = hashlib.blake2b(digest_size=20)

    def add(path: Path, name: str) -> None:
        digest.update(name.encode("utf-8", "surrogateescape") + b"\x00")
        with contextlib.suppress(FileNotFoundError), path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        digest.update(b"\x01")

    for index, path in enumerate(paths):
        if path.is_dir():
            for child in sorted(p for p in path.rglob("*") if p.is_file() or p.is_symlink()):
                add(child, f"{index}/{child.relative_to(path)}")
            continue
        add(path, str(index))
        for suffix in _SQLITE_SIDECARS:
            add(path.with_name(path.name + suffix), f"{index}{suffix}")
        for sibling in _siblings(path):
            add(sibling, f"{index}+{sibling.relative_to(path.parent)}")
    return digest.hexdigest()


def _siblings(copy: Path) -> list[Path]:
    """Files a server made beside a writable file's copy (its directory is the copy's alone): part
    of the episode's state, like the file. SQLite's own journal, WAL and shared-memory files are not
    (SQLite keeps them consistent with the file)."""
    own = {copy.name, *(copy.name + suffix for suffix in (*_SQLITE_SIDECARS, "-shm"))}
    if not copy.parent.is_dir():
        return []
    return sorted(p for p in copy.parent.rglob("*")
                  if (p.is_file() or p.is_symlink()) and p.relative_to(copy.parent).parts[0] not in own)


def sync_state(source: Path, target: Path, *, source_is_copy: bool) -> None:
    """`copy_state`, and for a file, the files beside it: those beside `source` when it is a copy
    (a slot's or a saved state's), none when it is the original (its directory is the user's)."""
    copy_state(source, target)
    if source.is_dir():
        return
    wanted = {p.relative_to(source.parent): p for p in _siblings(source)} if source_is_copy else {}
    for stale in _siblings(target):
        if stale.relative_to(target.parent) not in wanted:
            stale.unlink()
    for relative, path in wanted.items():
        (target.parent / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target.parent / relative, follow_symlinks=False)


@dataclass(frozen=True)
class IsolatedServer:
    """A server whose writes are isolated per episode: its spec and writable paths."""

    spec: MCPServerConfig  # placeholders filled (`resolved`); still naming the originals
    writable: tuple[tuple[str, Path], ...]  # (as written in the config, absolute original)
    base: Path  # what a relative path on its command line is taken against (its cwd)
    stateful: bool = False  # keeps state in memory: a process per episode

    def paths_in(self, directory: Path) -> list[Path]:
        """Where each writable path's copy lives under `directory`."""
        return [directory / str(index) / original.name for index, (_, original) in enumerate(self.writable)]

    def copy_into(self, directory: Path) -> MCPServerConfig:
        """Copy the writable paths into `directory` and return the spec pointed at the copies."""
        copies = self.paths_in(directory)
        for (_, original), target in zip(self.writable, copies, strict=True):
            copy_state(original, target)
        return point_at(self.spec, [(w, o, c) for (w, o), c in zip(self.writable, copies, strict=True)], self.base)


def _as_path(value: str, base: Path) -> Path | None:
    """`value` as an absolute normalised path (relative to `base`), or None when it names none."""
    if not value or "\x00" in value or "://" in value:
        return None
    path = Path(os.path.expanduser(value))
    return Path(os.path.normpath(path if path.is_absolute() else base / path))


def _repoint(text: str, pairs: Sequence[tuple[str, Path, Path]], base: Path) -> str:
    """`text` with a leading writable path (also after `--option=`) replaced by its copy; the path
    as written in the config, `./path`, `a/../path` or absolute all match (normalised)."""
    head, value = "", text
    if text.startswith("-") and "=" in text:
        key, _, value = text.partition("=")
        head = key + "="
    path = _as_path(value, base)
    if path is None:
        return text
    real = Path(os.path.realpath(path))  # symlinks too: the originals are resolved
    for _written, original, copy in pairs:
        for candidate in (path, real):
            if candidate == original:
                return head + str(copy)
            if original in candidate.parents:
                return head + str(copy / candidate.relative_to(original))
    return text


def point_at(spec: MCPServerConfig, pairs: Sequence[tuple[str, Path, Path]], base: Path) -> MCPServerConfig:
    """`spec` with every argument, env value and cwd naming an original path pointed at its copy
    instead (paths compared after normalisation, a relative one against `base`)."""
    return spec.model_copy(update={
        "args": [_repoint(a, pairs, base) for a in spec.args],
        "env": {k: _repoint(v, pairs, base) for k, v in spec.env.items()},
        "cwd": None if spec.cwd is None else _repoint(str(spec.cwd), pairs, base),
    })


def isolated_server(server: MCPServerConfig) -> IsolatedServer:
    """The per-episode form of `server` (already `resolved`), its writable paths checked: each must
    exist and be named by the server's args, env or cwd (else its copy could not be handed to it).
    One-line `UserInputError` otherwise."""
    base = Path(server.cwd).expanduser() if server.cwd else Path.cwd()
    writable = []
    for written in server.writable_paths:
        path = Path(written).expanduser()
        original = (path if path.is_absolute() else base / path).resolve()
        if not original.exists():
            raise UserInputError(f"env.mcp_servers {server.name!r}: writable_paths {written!r}: no such file or "
                                 f"directory ({original})")
        writable.append((written, original))
    for written, original in writable:
        marker = Path("/nonexistent-copy-check")
        if point_at(server, [(written, original, marker)], base) == server:
            raise UserInputError(
                f"env.mcp_servers {server.name!r}: writable_paths {written!r} is not named by the server's args, env "
                "or cwd, so each episode's copy cannot be handed to it: pass the path to the server in its command "
                f"line (e.g. --db-path {written})")
    return IsolatedServer(server, tuple(writable), base.resolve(), stateful=server.stateful)
