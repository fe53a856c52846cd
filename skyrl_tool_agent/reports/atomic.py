"""Files a person may read while they are rewritten: each new version is written beside the old one
and takes its name in one `os.replace`, so a reader never opens half of one."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = ["replaced_atomically", "write_text_atomically"]


@contextlib.contextmanager
def replaced_atomically(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` (same suffix) that replaces `path` when the body returns;
    if it raises, `path` is left as it was. The folder is made."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not mkstemp: its 0600 mode would survive the rename; a plain open keeps the umask's mode.
    tmp = path.with_name(f".{path.stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomically(path: Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` through `replaced_atomically`; returns `path`."""
    with replaced_atomically(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
