"""Nothing a run starts outlives it: its server processes and its copies of writable files.

`run_reaper()` is this process's `RunReaper`, made on first use:

- `run_dir`: one directory per run, holding every copy the run makes, with an `owner.json` (host,
  pid, start time); every new run sweeps this host's directories whose owner is dead (another
  host's are left to it: its pid means nothing here).
- a watchdog process (`mcp/watchdog.py`) that kills the registered server process groups and
  removes `run_dir` as soon as this process dies, by any signal (its stdin pipe reaches EOF: the
  one death notice Linux and macOS both give).

Server processes register themselves (`register`) when spawned and leave (`unregister`) when reaped.
A forked child (multiprocessing) gets its own reaper: the parent's belongs to the parent.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

import psutil

logger = logging.getLogger(__name__)

#: Under the system's temporary directory: where every run's directory lives.
ROOT_NAME = "skyrl-tool-agent"
OWNER_FILE = "owner.json"


def _owner_alive(run: Path) -> bool:
    """Whether the process that made `run` still runs (same pid and start time), or may: it runs on
    another host (directories written before the host was recorded count as this host's)."""
    try:
        owner = json.loads((run / OWNER_FILE).read_text())
        if owner.get("host", socket.gethostname()) != socket.gethostname():
            return True
        return abs(psutil.Process(int(owner["pid"])).create_time() - float(owner["started"])) < 1e-3
    except FileNotFoundError:
        # made an instant ago (owner.json not written yet), or by a run killed at that instant
        try:
            return run.stat().st_mtime + 60 > time.time()
        except OSError:
            return False
    except (psutil.Error, OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def sweep_dead_runs(root: Path) -> list[Path]:
    """Remove the run directories under `root` whose owner is dead; the ones removed."""
    removed = []
    if not root.is_dir():
        return removed
    for run in root.glob("run-*"):
        if run.is_dir() and not _owner_alive(run):
            shutil.rmtree(run, ignore_errors=True)
            removed.append(run)
    if removed:
        logger.info("removed %d temporary director%s left by dead runs under %s", len(removed),
                    "y" if len(removed) == 1 else "ies", root)
    return removed


class RunReaper:
    """This process's run directory and watchdog (module docstring)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        root = Path(tempfile.gettempdir()) / ROOT_NAME
        root.mkdir(parents=True, exist_ok=True)
        sweep_dead_runs(root)
        self.run_dir = root / f"run-{self.pid}-{secrets.token_hex(4)}"
        self.run_dir.mkdir()
        started = psutil.Process(self.pid).create_time()
        owner = {"host": socket.gethostname(), "pid": self.pid, "started": started}
        (self.run_dir / OWNER_FILE).write_text(json.dumps(owner))
        self._lock = threading.Lock()
        self._pipe: IO[str] | None = None
        self._watchdog: subprocess.Popen[str] | None = None

    def _ensure_watchdog(self) -> IO[str] | None:
        if self._pipe is None and self._watchdog is None:
            script = Path(__file__).with_name("watchdog.py")
            self._watchdog = subprocess.Popen(
                [sys.executable, "-I", str(script), str(self.run_dir)], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
            self._pipe = self._watchdog.stdin
            self._watchdog.wait()  # it forks and exits at once: the watchdog is its child, not ours
        return self._pipe

    def _send(self, line: str) -> None:
        with self._lock:
            if os.getpid() != self.pid:
                return
            pipe = self._ensure_watchdog()
            if pipe is None:
                return
            try:
                pipe.write(line + "\n")
                pipe.flush()
            except (BrokenPipeError, ValueError, OSError) as exc:  # the watchdog died: nothing to tell
                logger.warning("the run's watchdog is gone (%r): server processes may outlive a killed run", exc)
                self._pipe = None

    def register(self, pgid: int) -> None:
        """A server process group to kill if this process dies."""
        self._send(f"+{pgid}")

    def unregister(self, pgid: int) -> None:
        """That group is gone (reaped)."""
        self._send(f"-{pgid}")

    def new_dir(self, prefix: str) -> Path:
        """A fresh directory under the run directory."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.run_dir))


_REAPER: RunReaper | None = None
_REAPER_LOCK = threading.Lock()


def run_reaper() -> RunReaper:
    """This process's reaper (made on first use; a forked child makes its own)."""
    global _REAPER
    with _REAPER_LOCK:
        if _REAPER is None or _REAPER.pid != os.getpid():
            _REAPER = RunReaper()
        return _REAPER
