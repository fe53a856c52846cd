"""State isolation for MCP servers that write, and the run's original data, guarded by hash.

A server declared `stateful`, or given `writable_paths` (`config.env.MCPServerConfig`), never
serves two episodes: each episode starts its own process of it on its own copy of those paths
(`EpisodeTools`), and the copy is deleted when the episode ends. Every argument, env value or cwd
of the server that names a writable path is pointed at the copy (`point_at`), so the original is
never handed to a server. The runtime lists the server's tools once, from an instance on a copy of
its own.

Whatever the servers do, rewards read the run's original data: `OriginalData` takes the sha256 of
the files scoring reads (the SQL family's databases under the database root) and of every
writable path when the run starts, checks them before each episode is scored (by stat; a file
whose stat changed is hashed again) and hashes them all again when the run ends. A changed
original is an infrastructure fault: the episode raises `OriginalDataChanged` (unscored, counted
as an infra error, the file named), never a score.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_tool_agent.config.env import MCPServerConfig
from skyrl_tool_agent.config.errors import UserInputError
from skyrl_tool_agent.mcp.pool import BackgroundMCPPool, MCPClientPool, MCPPoolClosed, ServerSpec, ToolResult
from skyrl_tool_agent.rewards.execution import DatabaseUnavailableError

logger = logging.getLogger(__name__)

__all__ = ["EpisodeTools", "IsolatedServer", "OriginalData", "OriginalDataChanged", "isolated_server"]

#: SQLite keeps committed pages beside the database in these files; a copy takes them along.
_SQLITE_SIDECARS = ("-wal", "-journal")


class OriginalDataChanged(DatabaseUnavailableError):
    """A file the run's rewards read (or a server's original writable path) changed during the run:
    the episode is not scored (an infrastructure fault, never a score)."""


@dataclass(frozen=True)
class IsolatedServer:
    """A server that runs once per episode, on copies of its writable paths."""

    spec: ServerSpec  # placeholders filled; still naming the originals
    writable: tuple[tuple[str, Path], ...]  # (as written in the config, absolute original)

    def copy_into(self, directory: Path) -> ServerSpec:
        """Copy the writable paths into `directory` and return the spec pointed at the copies."""
        pairs = []
        for index, (written, original) in enumerate(self.writable):
            target = directory / str(index) / original.name
            target.parent.mkdir(parents=True)
            if original.is_dir():
                shutil.copytree(original, target, symlinks=True)
            else:
                shutil.copy2(original, target)
                for suffix in _SQLITE_SIDECARS:
                    sidecar = original.with_name(original.name + suffix)
                    if sidecar.is_file():
                        shutil.copy2(sidecar, target.with_name(target.name + suffix))
            pairs.append((written, original, target))
        return point_at(self.spec, pairs)


def _repoint(text: str, pairs: Sequence[tuple[str, Path, Path]]) -> str:
    """`text` with a leading writable path (also after `--option=`) replaced by its copy."""
    head, value = "", text
    if text.startswith("-") and "=" in text:
        key, _, value = text.partition("=")
        head = key + "="
    for written, original, copy in pairs:
        for form in sorted({written.rstrip("/") or written, str(original)}, key=len, reverse=True):
            if value == form:
                return head + str(copy)
            if value.startswith(form + "/"):
                return head + str(copy) + value[len(form):]
    return text


def point_at(spec: ServerSpec, pairs: Sequence[tuple[str, Path, Path]]) -> ServerSpec:
    """`spec` with every argument, env value and cwd naming an original (written, absolute) path
    pointed at its copy instead."""
    return spec.model_copy(update={
        "args": [_repoint(a, pairs) for a in spec.args],
        "env": None if spec.env is None else {k: _repoint(v, pairs) for k, v in spec.env.items()},
        "cwd": None if spec.cwd is None else _repoint(str(spec.cwd), pairs),
    })


def isolated_server(server: MCPServerConfig, spec: ServerSpec) -> IsolatedServer:
    """The per-episode form of `server` (already resolved), its writable paths checked: each must
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
        if point_at(spec, [(written, original, marker)]) == spec:
            raise UserInputError(
                f"env.mcp_servers {server.name!r}: writable_paths {written!r} is not named by the server's args, env "
                "or cwd, so each episode's copy cannot be handed to it: pass the path to the server in its command "
                f"line (e.g. --db-path {written})")
    return IsolatedServer(spec, tuple(writable))


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

    @property
    def files(self) -> list[Path]:
        return list(self._files)

    def _recheck(self, path: Path, *, full: bool) -> str | None:
        """Why `path` no longer holds its original bytes, or None."""
        stat, original = self._files[path]
        now = _stat_key(path)
        if now == stat and not full:
            return None
        if now is None:
            return f"{path} is gone"
        digest = _sha256(path)
        if digest != original:
            return f"{path} changed (sha256 {original[:12]} -> {digest[:12]})"
        self._files[path] = (now, original)  # the same bytes again: no need to hash it next time
        return None

    def check(self) -> None:
        """Before scoring: raise `OriginalDataChanged` if an original changed since the start."""
        for path in self._files:
            why = self._recheck(path, full=False)
            if why is not None:
                self._changed[path] = why
                raise OriginalDataChanged(f"original data changed during the run: {why}; the episode is not scored "
                                          "(declare the server that writes it with writable_paths, so each episode "
                                          "writes a copy)")

    def verify(self) -> list[str]:
        """At the end of the run: every original hashed again; what changed (also earlier), one line each."""
        for path in self._files:
            why = self._recheck(path, full=True)
            if why is not None:
                self._changed[path] = why
        return list(self._changed.values())


class EpisodeTools:
    """One episode's tool calls: a shared server's through the runtime's pool, an isolated server's
    through the episode's own process of it, started at the first such call on a fresh copy of its
    writable paths. `close`/`aclose` stop it and delete the copy."""

    def __init__(self, shared: BackgroundMCPPool, isolated: Sequence[IsolatedServer], *,
                 call_timeout_s: float) -> None:
        self.shared = shared
        self.isolated = tuple(isolated)
        #: Tools routed to the episode's own servers (the names the shared pool lists for them).
        self.isolated_tools = frozenset(
            t.name for t in shared.list_tools() if t.server in {s.spec.name for s in self.isolated})
        self.call_timeout_s = call_timeout_s
        self._pool: MCPClientPool | None = None
        self._dir: Path | None = None
        self._opening: asyncio.Lock | None = None  # created on the pool's loop, where it is used
        self._closed = False

    def __eq__(self, other: object) -> bool:  # two episodes' tools are alike until one starts its servers
        return isinstance(other, EpisodeTools) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def _key(self) -> tuple[Any, ...]:
        return self.shared, self.isolated, self.call_timeout_s, self._pool, self._dir, self._closed

    async def _open(self) -> MCPClientPool:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._closed:
                raise MCPPoolClosed("the episode has ended")
            if self._pool is None:
                directory = Path(tempfile.mkdtemp(prefix="skyrl-episode-"))
                try:
                    specs = [server.copy_into(directory / server.spec.name) for server in self.isolated]
                    pool = MCPClientPool(specs, call_timeout_s=self.call_timeout_s,
                                         sessions_per_server=1)
                    await pool.start()
                except BaseException:
                    shutil.rmtree(directory, ignore_errors=True)
                    raise
                self._pool, self._dir = pool, directory
            return self._pool

    async def _call_on_loop(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """One call, on the runtime pool's loop."""
        if name in self.isolated_tools:
            pool = await self._open()
            return await pool.call_tool(name, dict(arguments))
        return await self.shared.pool.call_tool(name, dict(arguments))

    async def call(self, name: str, arguments: Mapping[str, Any]) -> tuple[str, bool]:
        """One call from any event loop: (text, is_error)."""
        result = await asyncio.wrap_future(self.shared.submit(self._call_on_loop(name, arguments)))
        return result.text, result.is_error

    def call_sync(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> list[tuple[str, bool]]:
        """One turn's calls, concurrently, blocking (for the sync `step`)."""
        if not calls:
            return []

        async def gather() -> list[ToolResult]:
            return await asyncio.gather(*(self._call_on_loop(n, a) for n, a in calls))

        return [(r.text, r.is_error) for r in self.shared.run(gather())]

    async def _close_on_loop(self) -> None:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            self._closed = True
            pool, directory, self._pool, self._dir = self._pool, self._dir, None, None
        if pool is not None:
            await pool.close()
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    @property
    def opened(self) -> bool:
        return self._pool is not None

    async def aclose(self) -> None:
        """End the episode's own servers (idempotent)."""
        if self._pool is not None or self._dir is not None:
            await asyncio.wrap_future(self.shared.submit(self._close_on_loop()))
        self._closed = True

    def close(self) -> None:
        if self._pool is not None or self._dir is not None:
            self.shared.run(self._close_on_loop())
        self._closed = True


def scratch_dir() -> Path:
    """A private directory for the runtime's own copies (removed by the caller)."""
    return Path(tempfile.mkdtemp(prefix="skyrl-servers-"))


def remove_dir(path: Path | None) -> None:
    if path is not None and path.exists():
        shutil.rmtree(path, ignore_errors=True)
