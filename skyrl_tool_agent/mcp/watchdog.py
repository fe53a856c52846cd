"""The run's watchdog process: it outlives its trainer by at most a second.

Run by path (`python -I watchdog.py RUN_DIR`: no package import), detached in a session of its own,
so neither Ctrl-C nor a kill of the trainer's group reaches it. It reads `+PID` / `-PID` lines (the
servers' process groups) on stdin, the only pipe from the trainer; at EOF (the trainer exited by
any means, `kill -9` included) it SIGTERMs every group still registered, SIGKILLs those alive a
second later, and removes RUN_DIR.
"""

import os
import shutil
import signal
import sys
import time

GRACE_S = 1.0


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal(groups: set[int], sig: int) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def main(run_dir: str) -> None:
    groups: set[int] = set()
    for line in sys.stdin:
        line = line.strip()
        if line[:1] in "+-" and line[1:].isdigit():
            (groups.add if line[0] == "+" else groups.discard)(int(line[1:]))
    _signal(groups, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(_alive(g) for g in groups):
        time.sleep(0.05)
    _signal({g for g in groups if _alive(g)}, signal.SIGKILL)
    shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.fork():  # detach: the trainer waits for this first process only, and has no child left
        os._exit(0)
    main(sys.argv[1])
