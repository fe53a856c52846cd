"""Memory of a whole SQLite server process: what `--memory-limit-mb` means and how it holds.

`apply_server_limits(M)` (only a server calls it: every cap here is process-wide) sets three:

* the process's RSS ceiling: its RSS when the limits are set (the server's footprint after its
  imports, ~70 MiB) plus M MiB. The query watch (`mcp_tools.query_watch`) reads RSS every
  `RSS_POLL_S` while queries run; past the ceiling it first hands freed memory back to the OS
  and then, if RSS is still above it, stops the query that grew the process (`memory_victim`),
  which answers "memory limit". So the cap covers everything a query makes the process hold:
  SQLite's heap, malloc's overhead on it (~1.5 x what SQLite counts for a sorter's many small
  records), Python's copies of result rows;
* SQLite's heap at M MiB (`PRAGMA hard_heap_limit`: every connection, sorters, in-memory temp
  tables): an allocation past it fails at once, before any RSS check could see it;
* an address-space limit well above both, a backstop for memory neither sees.

What a query freed stays with malloc (glibc keeps freed pages in its heap); `release_freed_memory`,
after each server call, returns it to the OS once RSS has grown (`malloc_trim`), so the next call
starts from the server's idle footprint.
"""

from __future__ import annotations

import ctypes
import logging
import platform
import resource
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

logger = logging.getLogger(__name__)

#: Default `--memory-limit-mb`: RSS a server's queries may add to its footprint at start, and its SQLite heap cap.
MEMORY_LIMIT_MB = 256
#: Address space allowed above the heap cap and what the process had mapped when the limits were
#: set: worker-thread stacks (8 MiB each, reserved not used), malloc arenas and Python's own
#: objects. A backstop only; the RSS ceiling and the heap cap are what bound queries.
ADDRESS_SPACE_HEADROOM_MB = 1024
#: RSS growth (MiB) above the idle footprint at which a finished call hands the memory queries
#: freed back to the OS (`release_freed_memory`); below it the memory is reused anyway.
TRIM_ABOVE_MB = 32
#: How often the query watch reads RSS while queries run (s): a memory bomb adds a few MiB in that time.
RSS_POLL_S = 0.01
#: Least memory (share of the cap) a query's thread must have faulted in since the query started
#: for the query to be stopped when RSS is over the ceiling: one that added little is not what
#: grew the process (e.g. connections' page caches).
MIN_VICTIM_SHARE = 1 / 8
#: Shortest time between two trims made because RSS is over the ceiling (a trim locks malloc).
TRIM_EVERY_S = 0.1

_heap_limit_bytes: int | None = None
_rss_ceiling: int | None = None  # bytes; set by apply_server_limits
_rss_cap: int = 0  # bytes a server's queries may add (the cap)

T = TypeVar("T")


def heap_limit_bytes() -> int | None:
    """The SQLite heap cap set by `set_heap_limit` in this process, or None."""
    return _heap_limit_bytes


def memory_error_message() -> str:
    """Why a query ran out of memory, for the model."""
    if _heap_limit_bytes:
        return f"query exceeded the server's memory limit ({_heap_limit_bytes >> 20} MB)"
    return "query ran out of memory"


def set_heap_limit(limit_bytes: int) -> int:
    """Cap SQLite's heap for every connection of this process; returns the cap in force.

    SQLite can only lower the hard limit through the PRAGMA, so a second, larger call keeps the
    first cap. The soft limit (3/4 of it) makes page caches give memory back before queries fail.
    """
    global _heap_limit_bytes
    conn = sqlite3.connect(":memory:")
    try:
        (hard,) = conn.execute(f"PRAGMA hard_heap_limit={int(limit_bytes)}").fetchone()
        conn.execute(f"PRAGMA soft_heap_limit={int(hard) * 3 // 4}")
    finally:
        conn.close()
    _heap_limit_bytes = int(hard) or None
    return int(hard)


def _statm_bytes(field: int) -> int | None:
    """Field `field` of /proc/self/statm (0: address space mapped, 1: resident) in bytes (Linux), else None."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[field])
    except (OSError, ValueError, IndexError):
        return None
    return pages * resource.getpagesize()


def rss_bytes() -> int | None:
    """Resident memory of this process (Linux), else None."""
    return _statm_bytes(1)


def rss_ceiling() -> int | None:
    """The RSS (bytes) above which the query watch stops the query growing the process, or None."""
    return _rss_ceiling


def thread_faults(tid: int | None = None) -> int | None:
    """Minor page faults so far of thread `tid` (a native id; None: the calling thread), else None.

    Each is a page of memory the thread touched for the first time since it was mapped (or since
    a trim handed it back): the thread's share of the process's RSS growth (Linux, 4 KiB pages;
    transparent huge pages on "always" would count a 2 MiB page once).
    """
    if tid is None:
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt if hasattr(resource, "RUSAGE_THREAD") else None
    try:
        with open(f"/proc/self/task/{tid}/stat", encoding="ascii", errors="replace") as f:
            return int(f.read().rpartition(")")[2].split()[7])  # field 10, minflt; the name may hold ")"
    except (OSError, ValueError, IndexError):
        return None


def _limit_malloc_arenas(arenas: int) -> None:
    # glibc reserves 64 MiB of address space per malloc arena, up to 8 per core: on a large
    # machine that alone would outgrow any fixed RLIMIT_AS. And memory a query frees stays in its
    # thread's arena, so each arena can hold up to a whole heap cap of it: with one arena the RSS
    # stays near the cap (the worker threads' malloc calls then share one lock; SQLite's, mostly).
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    try:
        libc = ctypes.CDLL(None)
        m_arena_max = -8  # from malloc.h
        libc.mallopt(ctypes.c_int(m_arena_max), ctypes.c_int(arenas))
    except (OSError, AttributeError) as exc:
        logger.info("could not limit malloc arenas: %s", exc)


class _FreedMemory:
    """Hands memory that queries freed back to the OS (glibc `malloc_trim`), once RSS has grown.

    SQLite's heap cap counts what SQLite holds, not what malloc keeps after SQLite frees it: a
    window-function query took a server from 71 to 346 MiB RSS (SQLite's own peak: ~255 MiB) and
    the process stayed there, the freed sorter and temp b-tree pages scattered in the heap where
    only `malloc_trim` (MADV_DONTNEED on free pages inside it) returns them. `after_call` costs
    one read of /proc/self/statm; the trim runs only when RSS is `TRIM_ABOVE_MB` above the idle
    footprint (the lowest RSS at the end of a call), so cheap calls on a quiet server never pay for it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._floor: int | None = None  # lowest RSS (bytes) at the end of a call: the idle footprint
        self._last = 0.0  # time.monotonic() of the last trim
        self._trim: Callable[[int], int] | None = None
        self.trims = 0
        if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            try:
                trim = ctypes.CDLL(None).malloc_trim
                trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
                self._trim = trim
            except (OSError, AttributeError) as exc:
                logger.info("malloc_trim unavailable: %s", exc)

    def _trim_now(self, rss: int) -> int:
        """Trim (the lock held); RSS after it."""
        assert self._trim is not None
        start = time.perf_counter()
        self._trim(0)
        self.trims += 1
        self._last = time.monotonic()
        after = rss_bytes() or rss
        logger.debug("returned freed memory: RSS %d -> %d MiB in %.1f ms", rss >> 20, after >> 20,
                     1e3 * (time.perf_counter() - start))
        return after

    def after_call(self) -> None:
        if self._trim is None:
            return
        rss = rss_bytes()
        if rss is None:
            return
        with self._lock:  # one trim at a time; calls ending meanwhile see the new floor
            if self._floor is not None and rss - self._floor >= TRIM_ABOVE_MB << 20:
                # The floor never rises: a trim while another call holds memory must not hide
                # that memory from the trim after that call (a trim with nothing to free: ~0.04 ms).
                rss = self._trim_now(rss)
            self._floor = rss if self._floor is None else min(self._floor, rss)

    def over(self, ceiling: int) -> bool:
        """Whether RSS is above `ceiling`, after a trim (at most one per `TRIM_EVERY_S`)."""
        rss = rss_bytes()
        if rss is None or rss <= ceiling:
            return False
        with self._lock:
            if self._trim is not None and time.monotonic() - self._last >= TRIM_EVERY_S:
                rss = self._trim_now(rss)
        return rss > ceiling


_freed_memory = _FreedMemory()


def release_freed_memory() -> None:
    """After a server call: return memory queries freed to the OS if RSS grew (`_FreedMemory`)."""
    _freed_memory.after_call()


def memory_victim(running: Mapping[T, tuple[int, int]]) -> T | None:
    """Which running query to stop because the process is over its RSS ceiling, or None.

    `running` maps a query to (native id of its thread, the thread's `thread_faults` when the
    query started). None while RSS is under the ceiling once freed memory was handed back, or when
    no query's thread faulted in `MIN_VICTIM_SHARE` of the cap since its start; else the query
    whose thread faulted in the most: the one growing the process.
    """
    if _rss_ceiling is None or not _freed_memory.over(_rss_ceiling):
        return None
    page = resource.getpagesize()
    victim, most = None, MIN_VICTIM_SHARE * _rss_cap
    for query, (tid, at_start) in running.items():
        now = thread_faults(tid)
        if now is not None and (now - at_start) * page >= most:
            victim, most = query, (now - at_start) * page
    if victim is None:
        logger.debug("RSS %d MiB is over the ceiling (%d MiB), but no running query grew it",
                     (rss_bytes() or 0) >> 20, _rss_ceiling >> 20)
    return victim


def apply_server_limits(memory_limit_mb: int = MEMORY_LIMIT_MB) -> None:
    """Memory caps for a server process (module docstring); `memory_limit_mb <= 0` sets none."""
    global _rss_ceiling, _rss_cap
    if memory_limit_mb <= 0:
        return
    limit = set_heap_limit(memory_limit_mb << 20)
    _limit_malloc_arenas(1)
    rss = rss_bytes()
    if rss is not None and thread_faults() is not None:
        _rss_cap = memory_limit_mb << 20
        _rss_ceiling = rss + _rss_cap
    mapped = _statm_bytes(0)
    if mapped is None:
        logger.info("address space unknown on this platform; only the SQLite heap is capped")
        return
    wanted = mapped + limit + (ADDRESS_SPACE_HEADROOM_MB << 20)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft <= wanted:
        return  # already tighter
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (wanted, hard))
    except (ValueError, OSError) as exc:
        logger.warning("could not set RLIMIT_AS: %s", exc)
        return
    logger.info("RSS ceiling %s MiB, SQLite heap capped at %d MiB, address space at %d MiB",
                _rss_ceiling and _rss_ceiling >> 20, limit >> 20, wanted >> 20)


__all__ = [
    "MEMORY_LIMIT_MB",
    "apply_server_limits",
    "heap_limit_bytes",
    "memory_error_message",
    "memory_victim",
    "release_freed_memory",
    "rss_bytes",
    "rss_ceiling",
    "set_heap_limit",
    "thread_faults",
]
