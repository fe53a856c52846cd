"""One output directory, one run: a lock file holding the owner's pid.

Two runs writing one `training.output_dir` would mix their files without a word.
`acquire_output_dir` creates `<out>/.run.lock` exclusively; a second run seeing the owner alive
refuses with one line (`OutputDirInUse`); a dead owner's lock is taken over.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import psutil

from skyrl_tool_agent.config import UserInputError

logger = logging.getLogger(__name__)

LOCK_FILE = ".run.lock"


class OutputDirInUse(UserInputError):
    """Another live run holds the output directory."""


def _owner(path: Path) -> dict[str, Any] | None:
    try:
        owner = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else None


def _stale(owner: dict[str, Any] | None, path: Path) -> bool:
    if owner is None:  # unreadable: being written right now, or garbage left by a crash
        try:
            return time.time() - path.stat().st_mtime > 10
        except OSError:
            return True
    if owner.get("host") != socket.gethostname():
        return False  # another machine's run (shared file system): its pid means nothing here
    return not psutil.pid_exists(owner["pid"])  # someone else's process counts as alive


def acquire_output_dir(out: Path) -> Path:
    """Take `out`'s run lock (module docstring); returns the lock file's path."""
    path = Path(out) / LOCK_FILE
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = _owner(path)
            if not _stale(owner, path):
                who = f"pid {owner['pid']} on {owner.get('host')}" if owner else "another run"
                raise OutputDirInUse(
                    f"output directory {out} is in use by another run ({who}; lock file {path}): wait for it "
                    "to finish or choose another --output-dir; two runs in one directory would mix their "
                    "metrics and checkpoints") from None
            logger.warning("taking over the stale run lock %s (owner %s is gone)", path, owner)
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(me) + "\n")
        return path
    raise OutputDirInUse(f"output directory {out}: could not take its run lock {path}")


def release_output_dir(path: Path) -> None:
    """Remove the lock if this process owns it."""
    owner = _owner(path)
    if owner is not None and owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
        try:
            path.unlink()
        except OSError:
            pass
