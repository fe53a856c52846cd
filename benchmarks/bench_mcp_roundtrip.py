"""Round-trip cost of an `execute_sql` call: in-process sandbox vs MCP pool vs a fresh session per call.

    python benchmarks/bench_mcp_roundtrip.py [--calls N] [--db PATH] [--reps R] [--json-out FILE]

Modes (same queries for all):
  direct        mcp_tools.sandbox.run_query on an open connection, in this process (the floor)
  pool_s1       MCPClientPool, sessions_per_server=1 (one server process)
  pool_s2       MCPClientPool, sessions_per_server=2 (round-robin over two processes)
  background    BackgroundMCPPool (s=1) awaited from this loop: the rollout collector's path
  fresh         a new server process + session per call (spawn, initialize, call, shut down)

For each mode: sequential latency (p50/p99 over --calls calls) and concurrent throughput
(--calls calls from --concurrency tasks). Modes are interleaved within each repetition and the
table shows medians over repetitions. Not a unit test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import psutil  # noqa: E402
from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from mcp_tools.sandbox import open_readonly, run_query  # noqa: E402
from skyrl_tool_agent.config import MCPServerConfig  # noqa: E402
from skyrl_tool_agent.mcp.pool import BackgroundMCPPool, MCPClientPool  # noqa: E402

Call = Callable[[str], Awaitable[object]]


def make_db(path: Path) -> None:
    """A small two-table database (200 customers, 2,000 orders)."""
    rng = random.Random(0)
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE customer(id INTEGER PRIMARY KEY, name TEXT, city TEXT);"
        "CREATE TABLE orders(id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer(id), amount REAL);"
    )
    cities = ["Oslo", "Lima", "Pune", "Kyiv", "Austin"]
    conn.executemany(
        "INSERT INTO customer VALUES (?,?,?)", [(i, f"name{i}", rng.choice(cities)) for i in range(1, 201)]
    )
    conn.executemany(
        "INSERT INTO orders VALUES (?,?,?)",
        [(i, rng.randint(1, 200), round(rng.uniform(1, 500), 2)) for i in range(1, 2001)],
    )
    conn.commit()
    conn.close()


def queries(n: int) -> list[str]:
    """A fixed mix of Spider-sized queries (about 10-80 us each in-process)."""
    rng = random.Random(1)
    out = []
    for i in range(n):
        k = rng.randint(1, 200)
        out.append(
            [
                f"SELECT name, city FROM customer WHERE id = {k}",
                "SELECT city, count(*) FROM customer GROUP BY city ORDER BY 2 DESC",
                f"SELECT o.id, o.amount, c.name FROM orders o JOIN customer c ON c.id = o.customer_id "
                f"WHERE o.customer_id = {k}",
            ][i % 3]
        )
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds() -> float:
    """CPU time of this process and all its children (live ones and reaped ones)."""
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.NoSuchProcess:
            pass
    return total


async def measure(call: Call, sqls: list[str], concurrency: int) -> dict[str, float]:
    """Sequential p50/p99 latency (ms), concurrent throughput (calls/s) and CPU per call (us).

    CPU per call (client + servers) hardly depends on what else runs on the machine, unlike
    wall-clock figures on a shared box: 2 cores / (CPU per call) bounds calls/s on an idle one.
    """
    lat = []
    for sql in sqls:
        t0 = time.perf_counter()
        await call(sql)
        lat.append((time.perf_counter() - t0) * 1000)
    queue = list(sqls)

    async def worker() -> None:
        while queue:
            await call(queue.pop())

    cpu0, t0 = cpu_seconds(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    return {
        "p50_ms": pct(lat, 0.5),
        "p99_ms": pct(lat, 0.99),
        "calls_per_s": len(sqls) / elapsed,
        "cpu_us_per_call": cpu / len(sqls) * 1e6,
    }


def check(result: object) -> None:
    if getattr(result, "is_error", False):
        raise RuntimeError(f"benchmark query failed: {getattr(result, 'text', result)}")


async def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    db = Path(args.db) if args.db else None
    tmp = None
    if db is None:
        tmp = tempfile.TemporaryDirectory()
        db = Path(tmp.name) / "bench.sqlite"
        make_db(db)
    server_args = ["-m", "mcp_tools.sqlite_server", "--db", str(db)]
    spec = MCPServerConfig(name="sqlite", command=sys.executable, args=server_args, cwd=str(REPO_ROOT))
    sqls = queries(args.calls)
    conn = open_readonly(db)

    async def direct(sql: str) -> object:
        return run_query(conn, sql, timeout_s=5.0, max_rows=200, max_chars=8000)

    async def fresh(sql: str) -> object:
        params = StdioServerParameters(command=sys.executable, args=server_args, cwd=str(REPO_ROOT))
        async with stdio_client(params) as (r, w), ClientSession(r, w) as session:
            await session.initialize()
            result = await session.call_tool("execute_sql", {"sql": sql})
        check(result)
        return result

    pools = {
        "pool_s1": MCPClientPool([spec], sessions_per_server=1),
        "pool_s2": MCPClientPool([spec], sessions_per_server=2),
    }
    background = BackgroundMCPPool([spec], sessions_per_server=1)
    for pool in pools.values():
        await pool.start()
    await asyncio.to_thread(background.start)

    def pooled(pool: MCPClientPool) -> Call:
        async def call(sql: str) -> object:
            result = await pool.call_tool("execute_sql", {"sql": sql})
            check(result)
            return result

        return call

    async def bg(sql: str) -> object:
        result = await background.call_tool("execute_sql", {"sql": sql})
        check(result)
        return result

    modes: dict[str, tuple[Call, list[str]]] = {
        "direct": (direct, sqls),
        "pool_s1": (pooled(pools["pool_s1"]), sqls),
        "pool_s2": (pooled(pools["pool_s2"]), sqls),
        "background": (bg, sqls),
        "fresh": (fresh, sqls[: args.fresh_calls]),
    }
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    try:
        for rep in range(args.reps):
            order = list(modes) if rep % 2 == 0 else list(reversed(modes))  # interleave, alternate order
            for mode in order:
                call, mode_sqls = modes[mode]
                conc = min(args.concurrency, 4) if mode == "fresh" else args.concurrency
                runs[mode].append(await measure(call, mode_sqls, conc))
    finally:
        for pool in pools.values():
            await pool.close()
        await asyncio.to_thread(background.close)
        conn.close()
        if tmp is not None:
            tmp.cleanup()
    return {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per mode and repetition")
    parser.add_argument("--fresh-calls", type=int, default=20, help="calls for the fresh-session mode")
    parser.add_argument("--db", help="SQLite file (default: a generated two-table database)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    results = asyncio.run(run(args))
    load_after = os.getloadavg()[0]

    base_lat = results["direct"]["p50_ms"]
    base_tput = results["pool_s1"]["calls_per_s"]
    table = Table(
        title=f"execute_sql round trip ({args.calls} calls, {args.reps} reps, medians; "
        f"{os.cpu_count()} CPUs, load avg {load_before:.1f} -> {load_after:.1f})"
    )
    for col in ("mode", "p50 ms", "p99 ms", "calls/s", "CPU us/call", "p50 / direct", "calls/s / pool_s1"):
        table.add_column(col, justify="left" if col == "mode" else "right", no_wrap=True)
    for mode, r in results.items():
        table.add_row(
            mode,
            f"{r['p50_ms']:.3f}",
            f"{r['p99_ms']:.3f}",
            f"{r['calls_per_s']:.0f}",
            f"{r['cpu_us_per_call']:.0f}",
            f"{r['p50_ms'] / base_lat:.1f}x",
            f"{r['calls_per_s'] / base_tput:.2f}x",
        )
    Console(width=120).print(table)
    if args.json_out:
        payload = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "cpus": os.cpu_count(),
            "load_avg": [load_before, load_after],
            "results": results,
        }
        args.json_out.write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
