"""The run's original data, guarded by hash: rewards read only what the run started with.

`OriginalData` hashes the files scoring reads and every path a server may write when the run
starts, checks them (by stat, rehashing on change) before each scoring and hashes them again at
the end. A changed original raises `OriginalDataChanged`: an infrastructure fault, never a score.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from skyrl_tool_agent.rewards.execution import DatabaseUnavailableError


class OriginalDataChanged(DatabaseUnavailableError):
    """A file the run's rewards read (or a server's original writable path) changed during the run:
    the episode is not scored (an infrastructure fault, never a score)."""


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


class OriginalData:
    """The sha256 of the run's original files, taken at the start (module docstring)."""

    def __init__(self, paths: Iterable[Path]) -> None:
        files: list[Path] = []
        for path in paths:
            files.extend(sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path])
        #: file -> (stat at the last check, sha256 at the start)
        self._files: dict[Path, tuple[tuple[int, int, int] | None, str]] = {
            f: (_stat_key(f), _sha256(f)) for f in dict.fromkeys(files)}
        self._changed: dict[Path, str] = {}

    def _recheck(self, path: Path, *, full: bool) -> str | None:
        """Why `path` no longer holds its original bytes (kept for `verify`), or None."""
        stat, original = self._files[path]
        now = _stat_key(path)
        if now == stat and not full:
            return None
        if now is None:
            self._changed[path] = f"{path} is gone"
        elif (digest := _sha256(path)) != original:
            self._changed[path] = f"{path} changed (sha256 {original[:12]} -> {digest[:12]})"
        else:
            self._files[path] = (now, original)  # the same bytes again: no need to hash it next time
            return None
        return self._changed[path]

    def check(self) -> None:
        """Before scoring: raise `OriginalDataChanged` if an original changed since the start."""
        for path in self._files:
            if (why := self._recheck(path, full=False)) is not None:
                raise OriginalDataChanged(f"original data changed during the run: {why}; the episode is not scored "
                                          "(declare the server that writes it with writable_paths, so each episode "
                                          "writes a copy)")

    def verify(self) -> list[str]:
        """At the end of the run: every original hashed again; what changed (also earlier), one line each."""
        for path in self._files:
            self._recheck(path, full=True)
        return list(self._changed.values())
