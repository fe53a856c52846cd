"""Issue 28 #10 and #11 through a real server process, raw JSON-RPC over its stdio: an over-long
line and a batch are answered; responses are capped in bytes (structured part included); a
symlinked directory does not serve a database outside the root; invisible leading characters do
not hide a refused keyword."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from mcp_tools.fast_stdio import MAX_LINE_BYTES
from mcp_tools.sqlite_server import MAX_RESPONSE_BYTES
from tests.fixtures.raw_server import raw_exchange
from tests.hostile_sql import make_hostile_db

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]


def _call(request_id: Any, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


def _line(message: Any) -> bytes:
    return json.dumps(message).encode() + b"\n"


@pytest.fixture
def db_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    make_hostile_db(root / "demo").rename(root / "demo" / "demo.sqlite")
    elsewhere = tmp_path / "elsewhere" / "secret"
    make_hostile_db(elsewhere).rename(elsewhere / "secret.sqlite")
    os.symlink(elsewhere, root / "secret")  # a directory in the root that leads out of it
    return root


async def test_raw_faults_are_answered_and_bounded(db_root: Path) -> None:
    #: Control characters escape to six bytes each in JSON: 8,000 of them in text and structured rows.
    controls = ("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 200) "
                "SELECT replace(hex(zeroblob(20)), '0', char(1)) AS v FROM r")
    oversize = _line(_call(2, "execute_sql", {"db_id": "demo", "sql": "SELECT 1", "pad": "x" * (MAX_LINE_BYTES + 10)}))
    requests: list[bytes] = [
        oversize,
        _line([_call(3, "execute_sql", {"db_id": "demo", "sql": "SELECT 1"}),
               _call(4, "list_tables", {"db_id": "demo"})]),
        _line(_call(5, "execute_sql", {"db_id": "secret", "sql": "SELECT count(*) FROM singer"})),
        _line(_call(6, "list_tables", {"db_id": "secret"})),
        _line(_call(7, "execute_sql", {"db_id": "demo", "sql": "\ufeffREINDEX"})),
        _line(_call(8, "execute_sql", {"db_id": "demo", "sql": "/* x */ \u200bVACUUM"})),
        _line(_call(9, "execute_sql", {"db_id": "demo", "sql": controls})),
        _line(_call(10, "execute_sql", {"db_id": "demo", "sql": "SELECT count(*) FROM singer"})),
    ]
    answers, sizes = await raw_exchange(["--db-root", str(db_root)], requests, set(range(1, 11)), timeout_s=90)

    def text(request_id: int) -> str:
        return answers[request_id]["result"]["content"][0]["text"]

    assert answers[2]["error"]["code"] == -32600 and "longer than" in answers[2]["error"]["message"]
    for request_id in (3, 4):
        assert answers[request_id]["error"]["code"] == -32600, answers[request_id]
        assert "batches are not supported" in answers[request_id]["error"]["message"]
    for request_id in (5, 6):
        assert answers[request_id]["result"]["isError"], answers[request_id]
        assert "secret" in text(request_id) and "41" not in text(request_id)
    assert text(7) == "denied: schema changes are not allowed (REINDEX)"
    assert text(8) == "denied: VACUUM is not allowed"
    result = answers[9]["result"]
    assert not result["isError"] and result["structuredContent"]["truncated"]
    assert sizes[9] <= MAX_RESPONSE_BYTES + 1024, sizes[9]
    assert text(10) == "count(*)\n41"
