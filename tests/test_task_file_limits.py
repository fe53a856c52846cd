"""The SQL server's limits hold for the tools of a one-file task family (issue 35): a real
`--task-file` server process (as `task_file_overrides` starts it) through the real MCP client pool.

* size: a result over 64 KiB is answered `too large: ...` by the server process, before it is
  sent (a 32 MB result used to take 14 s to read through the client, and grew the run to 742 MB);
* time: a call is answered by the server's own deadline, 0.8 x the pool's call timeout, even while
  a large result is being produced, so the model reads `timeout: ...` and the session stays in
  rotation (the call used to fail as `MCPServerUnavailable` at the client's deadline).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_tools.result_caps import MAX_ERROR_CHARS, MAX_RESPONSE_BYTES
from skyrl_tool_agent.config import MCPServerConfig
from skyrl_tool_agent.examples.one_file import task_file_overrides
from skyrl_tool_agent.mcp.pool import BackgroundMCPPool
from tests.fixtures.config_files import REPO

#: The pool's deadline for one call; the server's own limit is 0.8 x this.
CALL_TIMEOUT_S = 4.0
SERVER_LIMIT_S = 0.8 * CALL_TIMEOUT_S

TASK_FILE = '''
import time

from skyrl_tool_agent.env.families import TaskFamily


def text_of(chars: int) -> str:
    """A text of `chars` characters."""
    return "x" * chars


def numbers(n: int) -> list[int]:
    """The numbers 0 .. n-1."""
    return list(range(n))


def wait_then_text(seconds: float, chars: int) -> str:
    """Wait, then a text of `chars` characters."""
    time.sleep(seconds)
    return "x" * chars


def beat(path: str) -> str:
    """Append a dot to a file every 10 ms, for up to 60 s."""
    end = time.monotonic() + 60
    with open(path, "a") as f:
        while time.monotonic() < end:
            f.write(".")
            f.flush()
            time.sleep(0.01)
    return "done"


def fail_with(chars: int) -> str:
    """Raise an error whose message has `chars` characters."""
    raise ValueError("y" * chars)


TOOLS = [text_of, numbers, wait_then_text, beat, fail_with]
TASKS = [{"task_id": "t-0", "question": "?", "ground_truth": "x", "difficulty": "easy"}]


def correct(episode) -> float:
    return float(episode.answer == episode.ground_truth)


FAMILY = TaskFamily(name="limits", system_prompt="Use the tools.", verdict_term="correct")
'''


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundMCPPool]:
    path = tmp_path_factory.mktemp("task_file") / "limits_task.py"
    path.write_text(TASK_FILE)
    servers = next(json.loads(o.partition("=")[2]) for o in task_file_overrides(path) if o.startswith("env.mcp_servers="))
    specs = [MCPServerConfig(**server, cwd=str(REPO)) for server in servers]
    with BackgroundMCPPool(specs, call_timeout_s=CALL_TIMEOUT_S) as started:
        yield started


def timed_call(pool: BackgroundMCPPool, name: str, **arguments: object) -> tuple[str, bool, float]:
    start = time.monotonic()
    result = pool.run(pool.pool.call_tool(name, arguments))
    return result.text, result.is_error, time.monotonic() - start


def test_a_result_over_64_kib_is_refused_by_the_server(pool: BackgroundMCPPool) -> None:
    text, is_error, _ = timed_call(pool, "text_of", chars=60_000)
    assert (len(text), is_error) == (60_000, False)  # under the cap: whole

    refusal = f"too large: text_of returned more than {MAX_RESPONSE_BYTES:,} bytes"
    text, is_error, _ = timed_call(pool, "text_of", chars=70_000)
    assert is_error and text.startswith(refusal), text[:200]

    text, is_error, seconds = timed_call(pool, "text_of", chars=32 << 20)  # read in 14 s, and 742 MB, before
    assert is_error and text.startswith(refusal), text[:200]
    assert seconds < SERVER_LIMIT_S, seconds

    text, is_error, _ = timed_call(pool, "numbers", n=100_000)  # any value, not only text
    assert is_error and text.startswith("too large: numbers returned"), text[:200]
    text, is_error, _ = timed_call(pool, "numbers", n=3)
    assert (text, is_error) == ("0\n1\n2", False)


def test_a_huge_error_message_is_clipped(pool: BackgroundMCPPool) -> None:
    text, is_error, _ = timed_call(pool, "fail_with", chars=1_000_000)
    assert is_error and "ValueError: yyy" in text and "1,000,012 characters, clipped" in text, text[:300]
    assert len(text) < MAX_ERROR_CHARS + 200


def test_a_call_is_answered_by_the_servers_deadline(pool: BackgroundMCPPool) -> None:
    pids = pool.pool.server_pids()
    # A tool that takes longer than the server's limit: the server answers, before the client's deadline.
    text, is_error, seconds = timed_call(pool, "wait_then_text", seconds=4.5, chars=10)
    assert (text, is_error) == (f"timeout: wait_then_text ran longer than {SERVER_LIMIT_S:g} s", True)
    assert SERVER_LIMIT_S <= seconds < CALL_TIMEOUT_S, seconds
    # A large result produced slowly, within the limit: refused as soon as it is there, not sent.
    text, is_error, seconds = timed_call(pool, "wait_then_text", seconds=1, chars=32 << 20)
    assert is_error and text.startswith("too large: wait_then_text returned"), text[:200]
    assert seconds < SERVER_LIMIT_S, seconds
    # The session answered each time: still the same server, in rotation, serving at once.
    text, is_error, seconds = timed_call(pool, "numbers", n=2)
    assert (text, is_error) == ("0\n1", False) and seconds < 1.0
    assert pool.pool.server_pids() == pids


def test_a_tool_the_watchdog_gave_up_on_stops(pool: BackgroundMCPPool, tmp_path: Path) -> None:
    """Once the server has answered `timeout:`, the tool's thread stops (issue 43: it ran on for
    as long as the tool liked, its answer dropped, a thread and its work per abandoned call)."""
    beats = tmp_path / "beats"
    text, is_error, _ = timed_call(pool, "beat", path=str(beats))
    assert (text, is_error) == (f"timeout: beat ran longer than {SERVER_LIMIT_S:g} s", True)
    time.sleep(0.2)
    size = beats.stat().st_size
    assert size > 50  # it ran, ~100 beats a second
    time.sleep(0.5)
    assert beats.stat().st_size == size  # and no longer
    text, is_error, seconds = timed_call(pool, "numbers", n=2)
    assert (text, is_error) == ("0\n1", False) and seconds < 1.0
