"""State isolation for MCP servers that write, and the run's original data, guarded by hash.

A server given `writable_paths` (`config.env.MCPServerConfig`) never shows one episode's writes to
another, yet does not cost a process per episode: it runs as a warm pool (`WarmServers`) of at
most `env.isolation_pool_size` processes, each on its own slot directory holding copies of those
paths, started one at a time as calls need them. A call takes a slot for itself alone; the slot's
files hold that episode's state: the original's bytes for an episode that has not called yet (a
slot is restored from the original, SQLite's backup API for a database, a plain copy otherwise),
else the episode's own latest state (the slot it last used, if no other episode took it since,
else the episode's saved copy, restored into the slot). An episode whose slot another episode
takes has its state saved first. The server's own process is never told: between two calls its
files change under it as a fresh process would find them. So a server that keeps state in memory
must say so (`stateful: true`): each of its episodes gets a process of its own, started at its
first call, on its own copy, as before.

Every argument, env value or cwd of the server that names a writable path (as written, `./x` or
absolute, compared after normalisation: `point_at`) is pointed at the slot's copy, so the original
is never handed to a server. Every copy lives under the run's directory (`mcp.reaper`), removed
when the run ends however it ends.

Whatever the servers do, rewards read the run's original data: `OriginalData` takes the sha256 of
the files scoring reads (the SQL family's databases under the database root) and of every
writable path when the run starts, checks them before each episode is scored (by stat; a file
whose stat changed is hashed again) and hashes them all again when the run ends. A changed
original is an infrastructure fault: the episode raises `OriginalDataChanged` (unscored, counted
as an infra error, the file named), never a score.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import shutil
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_tool_agent.config.env import MCPServerConfig
from skyrl_tool_agent.config.errors import UserInputError
from skyrl_tool_agent.mcp.pool import (
    BackgroundMCPPool,
    MCPClientPool,
    MCPPoolClosed,
    MCPPoolError,
    MCPServerUnavailable,
    ServerSpec,
    ToolResult,
    ToolSpec,
)
from skyrl_tool_agent.mcp.reaper import run_reaper
from skyrl_tool_agent.rewards.execution import DatabaseUnavailableError

logger = logging.getLogger(__name__)

__all__ = ["EpisodeTools", "IsolatedServer", "OriginalData", "OriginalDataChanged", "WarmServers", "isolated_server"]

#: SQLite keeps committed pages beside the database in these files; a copy takes them along.
_SQLITE_SIDECARS = ("-wal", "-journal")


class OriginalDataChanged(DatabaseUnavailableError):
    """A file the run's rewards read (or a server's original writable path) changed during the run:
    the episode is not scored (an infrastructure fault, never a score)."""


_SQLITE_HEADER = b"SQLite format 3\x00"
#: Files below this size are digested on the event loop (tens of microseconds), not in a thread.
_INLINE_BYTES = 1 << 20


def _is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(16) == _SQLITE_HEADER
    except OSError:
        return False


def copy_state(source: Path, target: Path) -> None:
    """Make `target` hold what `source` holds, in place (a server may have `target` open).

    A SQLite database goes through SQLite's backup API (a consistent copy, its journal or WAL
    included, that readers of `target` see at their next transaction); the source is opened
    read-only, so an original is never written. Another file is copied over `target`'s bytes; a
    directory is emptied and filled again (the directory itself stays)."""
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
    name): equal digests, equal state. Cheaper than a copy, so a slot whose files no call changed is
    neither saved nor restored."""
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

    spec: ServerSpec  # placeholders filled; still naming the originals
    writable: tuple[tuple[str, Path], ...]  # (as written in the config, absolute original)
    base: Path  # what a relative path on its command line is taken against (its cwd)
    stateful: bool = False  # keeps state in memory: a process per episode

    def paths_in(self, directory: Path) -> list[Path]:
        """Where each writable path's copy lives under `directory`."""
        return [directory / str(index) / original.name for index, (_, original) in enumerate(self.writable)]

    def copy_into(self, directory: Path) -> ServerSpec:
        """Copy the writable paths into `directory` and return the spec pointed at the copies."""
        copies = self.paths_in(directory)
        for (_, original), target in zip(self.writable, copies, strict=True):
            target.parent.mkdir(parents=True, exist_ok=True)
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


def point_at(spec: ServerSpec, pairs: Sequence[tuple[str, Path, Path]], base: Path | None = None) -> ServerSpec:
    """`spec` with every argument, env value and cwd naming an original path pointed at its copy
    instead (paths compared after normalisation, a relative one against `base`, else the cwd)."""
    base = base or Path.cwd()
    return spec.model_copy(update={
        "args": [_repoint(a, pairs, base) for a in spec.args],
        "env": None if spec.env is None else {k: _repoint(v, pairs, base) for k, v in spec.env.items()},
        "cwd": None if spec.cwd is None else _repoint(str(spec.cwd), pairs, base),
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
        if point_at(spec, [(written, original, marker)], base) == spec:
            raise UserInputError(
                f"env.mcp_servers {server.name!r}: writable_paths {written!r} is not named by the server's args, env "
                "or cwd, so each episode's copy cannot be handed to it: pass the path to the server in its command "
                f"line (e.g. --db-path {written})")
    return IsolatedServer(spec, tuple(writable), base.resolve(), stateful=server.stateful)


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


class _Slot:
    """One warm process of a `WarmServers`, on its own directory of copies."""

    def __init__(self, directory: Path, pool: MCPClientPool, paths: list[Path]) -> None:
        self.directory = directory
        self.pool = pool
        self.paths = paths  # the copies its server was pointed at
        self.busy = False
        self.holder: _EpisodeState | None = None  # the episode whose state the files hold, if any
        self.from_original = True  # the files were the original's when `digest` was taken
        self.digest: str | None = None  # of the files when installed: unchanged since = no call wrote


class _EpisodeState:
    """One episode's state of one warm server: in a slot (`resident`) or saved (`saved`), else the original's."""

    def __init__(self) -> None:
        self.resident: _Slot | None = None
        self.saved: Path | None = None
        self.lost: str | None = None  # its server failed mid-call: the state is gone, the episode cannot go on
        self.ended = False


class WarmServers:
    """At most `size` processes of one server with writable paths, shared by every episode (module
    docstring). Lives on the runtime pool's event loop; every method runs there."""

    def __init__(self, server: IsolatedServer, *, size: int, call_timeout_s: float) -> None:
        self.server = server
        self.size = max(1, size)
        self.call_timeout_s = call_timeout_s
        self.slots: list[_Slot] = []
        self._starting = 0  # slots being started (counted against size)
        self._growing: set[asyncio.Task[None]] = set()
        self._grow_error: str | None = None
        self._changed: asyncio.Condition | None = None
        self._closed = False
        #: What the slots did, for the log and the benchmark: restores from the original, saves and
        #: restores of an episode's state, slots started.
        self.counts = {"slots_started": 0, "restored_original": 0, "saved": 0, "restored_saved": 0}

    @property
    def name(self) -> str:
        return self.server.spec.name

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _new_slot(self) -> _Slot:
        directory = run_reaper().new_dir(f"slot-{self.name}-")
        try:
            spec = await asyncio.to_thread(self.server.copy_into, directory)
            pool = MCPClientPool([spec], call_timeout_s=self.call_timeout_s, sessions_per_server=1)
            await pool.start()
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self.counts["slots_started"] += 1
        slot = _Slot(directory, pool, self.server.paths_in(directory))
        slot.digest = await self._digest(slot.paths)
        return slot

    async def start(self) -> list[ToolSpec]:
        """Start the first slot (its tools are the server's listing); the others start on demand."""
        slot = await self._new_slot()
        self.slots.append(slot)
        return slot.pool.tools

    def processes(self) -> int:
        return len(self.slots)

    async def _acquire(self, state: _EpisodeState) -> _Slot:
        condition = self._condition()
        async with condition:
            while True:
                if self._closed:
                    raise MCPPoolClosed(f"the MCP server {self.name!r} is closed")
                if state.resident is not None:  # its state is in that slot: wait for it (its own calls serialise)
                    if state.resident in self.slots and not state.resident.busy:
                        slot = state.resident
                        slot.busy = True
                        return slot
                    if state.resident not in self.slots:
                        state.resident = None
                        continue
                else:
                    idle = [s for s in self.slots if not s.busy]
                    # a free slot first (no episode's state to keep), then a live episode's (saved first
                    # if its calls changed the files)
                    idle.sort(key=lambda s: s.holder is not None and not s.holder.ended)
                    if idle:
                        slot = idle[0]
                        slot.busy = True
                        return slot
                    if len(self.slots) + self._starting < self.size:
                        # every slot busy: one more process, started aside; this call takes whichever
                        # slot frees first (a busy one usually does, long before a process starts)
                        self._starting += 1
                        task = asyncio.get_running_loop().create_task(self._grow())
                        self._growing.add(task)
                        task.add_done_callback(self._growing.discard)
                    elif not self.slots and not self._starting:
                        raise MCPServerUnavailable(f"MCP server {self.name!r} cannot start: {self._grow_error}")
                await condition.wait()

    async def _grow(self) -> None:
        try:
            slot = await self._new_slot()
        except Exception as exc:  # noqa: BLE001 - the callers waiting hear of it (no slot left) or use the others
            self._grow_error = f"{type(exc).__name__}: {exc}"
            logger.warning("MCP server %r: another process did not start: %s", self.name, self._grow_error)
            slot = None
        async with self._condition():
            self._starting -= 1
            if slot is not None and not self._closed:
                self.slots.append(slot)
                slot = None
            self._condition().notify_all()
        if slot is not None:  # closed meanwhile
            await slot.pool.close()
            shutil.rmtree(slot.directory, ignore_errors=True)

    async def _install(self, slot: _Slot, state: _EpisodeState) -> None:
        """Make the slot's files hold `state`: its saved copy, else the original's bytes. The live
        episode whose state they held is saved first, unless no call changed them (digest)."""
        if slot.holder is state:
            return
        changed = slot.digest is None or await self._digest(slot.paths) != slot.digest
        holder = slot.holder
        if holder is not None and not holder.ended and holder.lost is None:
            if changed:  # else its state is still what was installed: its saved copy, or the original
                saved = holder.saved or run_reaper().new_dir(f"state-{self.name}-")
                await asyncio.to_thread(self._copy_all, slot.paths, self.server.paths_in(saved))
                holder.saved = saved
                self.counts["saved"] += 1
            holder.resident = None
        if state.saved is not None:
            await asyncio.to_thread(self._copy_all, self.server.paths_in(state.saved), slot.paths)
            self.counts["restored_saved"] += 1
            slot.digest = await self._digest(slot.paths)
        elif changed or not slot.from_original:
            await asyncio.to_thread(functools.partial(self._copy_all, [o for _, o in self.server.writable], slot.paths,
                                                      from_original=True))
            self.counts["restored_original"] += 1
            slot.digest = await self._digest(slot.paths)
        slot.holder, slot.from_original = state, state.saved is None
        state.resident = slot

    async def _digest(self, paths: Sequence[Path]) -> str:
        """`state_digest`, in a thread unless the files are small (a thread hop costs more)."""
        small = all(p.is_file() and p.stat().st_size < _INLINE_BYTES for p in paths)
        return state_digest(paths) if small else await asyncio.to_thread(state_digest, paths)

    @staticmethod
    def _copy_all(sources: Sequence[Path], targets: Sequence[Path], *, from_original: bool = False) -> None:
        for source, target in zip(sources, targets, strict=True):
            sync_state(source, target, source_is_copy=not from_original)

    async def call(self, state: _EpisodeState, name: str, arguments: dict[str, Any]) -> ToolResult:
        """One call of an episode, on a slot holding its state."""
        if state.lost is not None:
            raise MCPServerUnavailable(state.lost)
        slot = await self._acquire(state)
        try:
            await self._install(slot, state)
            return await slot.pool.call_tool(name, arguments)
        except MCPPoolError as exc:
            # The server failed or hung mid-call: what it wrote is unknown. Its slot is retired (a
            # fresh one replaces it on demand) and the episode's state is gone with it.
            state.lost = f"MCP server {self.name!r} failed during an episode that writes to it, losing the " \
                         f"episode's copy of its files ({exc})"
            await self._retire(slot)
            raise
        finally:
            slot.busy = False
            async with self._condition():
                self._condition().notify_all()

    async def _retire(self, slot: _Slot) -> None:
        async with self._condition():
            if slot in self.slots:
                self.slots.remove(slot)
        if slot.holder is not None:
            slot.holder.resident = None
        await slot.pool.close()
        shutil.rmtree(slot.directory, ignore_errors=True)

    async def end(self, state: _EpisodeState) -> None:
        """The episode ended: its saved copy goes, its slot's files are the original's again at next use."""
        state.ended = True
        if state.saved is not None:
            saved, state.saved = state.saved, None
            await asyncio.to_thread(shutil.rmtree, saved, True)
        state.resident = None
        async with self._condition():
            self._condition().notify_all()

    async def close(self) -> None:
        self._closed = True
        async with self._condition():
            self._condition().notify_all()
        await asyncio.gather(*self._growing, return_exceptions=True)
        slots, self.slots = self.slots, []
        await asyncio.gather(*(slot.pool.close() for slot in slots), return_exceptions=True)
        for slot in slots:
            shutil.rmtree(slot.directory, ignore_errors=True)
        if self.counts["slots_started"]:
            logger.info("MCP server %r: %d warm process(es) served its episodes (%s)", self.name,
                        self.counts["slots_started"], ", ".join(f"{k} {v}" for k, v in self.counts.items()))


class EpisodeTools:
    """One episode's tool calls: a shared server's through the runtime's pool, a server with writable
    paths through its `WarmServers` (on a slot holding this episode's state), a stateful server's
    through the episode's own process of it, started at its first call to that server (not to any
    other) on a fresh copy of its writable paths. `close`/`aclose` end the episode: its state and
    own processes go."""

    def __init__(self, shared: BackgroundMCPPool, isolated: Sequence[IsolatedServer], *,
                 call_timeout_s: float, warm: Mapping[str, WarmServers] | None = None,
                 tools: Sequence[ToolSpec] | None = None) -> None:
        self.shared = shared
        self.isolated = tuple(s for s in isolated if s.stateful)  # a process per episode
        self.warm = dict(warm or {})
        listed = list(tools) if tools is not None else shared.list_tools()
        #: Tool name -> the warm servers that serve it.
        self.warm_tools: dict[str, WarmServers] = {t.name: self.warm[t.server] for t in listed if t.server in self.warm}
        #: Tools routed to the episode's own servers (the names the runtime lists for them).
        self.isolated_tools: dict[str, IsolatedServer] = {
            t.name: s for t in listed for s in self.isolated if t.server == s.spec.name}
        self.call_timeout_s = call_timeout_s
        self._states: dict[str, _EpisodeState] = {}
        self._pools: dict[str, MCPClientPool] = {}  # the stateful servers it called, by name
        self._dir: Path | None = None
        self._opening: asyncio.Lock | None = None  # created on the pool's loop, where it is used
        self._closed = False

    def __eq__(self, other: object) -> bool:  # two episodes' tools are alike until one calls a server
        return isinstance(other, EpisodeTools) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def _key(self) -> tuple[Any, ...]:
        return (self.shared, self.isolated, tuple(self.warm.items()), self.call_timeout_s, tuple(self._pools), self._dir,
                self._closed, tuple(self._states))

    async def _open(self, server: IsolatedServer) -> MCPClientPool:
        """The episode's own process of a stateful server, started at its first call to it."""
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._closed:
                raise MCPPoolClosed("the episode has ended")
            pool = self._pools.get(server.spec.name)
            if pool is None:
                self._dir = self._dir or run_reaper().new_dir("episode-")
                directory = self._dir / server.spec.name
                try:
                    spec = await asyncio.to_thread(server.copy_into, directory)
                    pool = MCPClientPool([spec], call_timeout_s=self.call_timeout_s, sessions_per_server=1)
                    await pool.start()
                except BaseException:
                    shutil.rmtree(directory, ignore_errors=True)
                    raise
                self._pools[server.spec.name] = pool
            return pool

    async def _call_on_loop(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """One call, on the runtime pool's loop."""
        warm = self.warm_tools.get(name)
        if warm is not None:
            if self._closed:
                raise MCPPoolClosed("the episode has ended")
            state = self._states.setdefault(warm.name, _EpisodeState())
            return await warm.call(state, name, dict(arguments))
        stateful = self.isolated_tools.get(name)
        if stateful is not None:
            pool = await self._open(stateful)
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
            pools, directory, self._pools, self._dir = self._pools, self._dir, {}, None
            states, self._states = self._states, {}
        for server_name, state in states.items():
            await self.warm[server_name].end(state)
        await asyncio.gather(*(pool.close() for pool in pools.values()), return_exceptions=True)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    @property
    def opened(self) -> bool:
        """Whether the episode called a server that isolates it (it has state to drop)."""
        return bool(self._pools) or bool(self._states)

    async def aclose(self) -> None:
        """End the episode's state and own servers (idempotent)."""
        if self.opened or self._dir is not None:
            await asyncio.wrap_future(self.shared.submit(self._close_on_loop()))
        self._closed = True

    def close(self) -> None:
        if self.opened or self._dir is not None:
            self.shared.run(self._close_on_loop())
        self._closed = True


def scratch_dir() -> Path:
    """A private directory for the runtime's own copies, under the run's directory (removed by the
    caller, and with the run however it ends)."""
    return run_reaper().new_dir("servers-")


def remove_dir(path: Path | None) -> None:
    if path is not None and path.exists():
        shutil.rmtree(path, ignore_errors=True)
