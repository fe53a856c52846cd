"""Cheap-call latency beside slow queries: does a SQLite MCP server stay responsive under load?

    python benchmarks/bench_sandbox_load.py [--servers 1 4] [--slow 8] [--duration S] [--reps R]
                                            [--timeout-s T] [--json-out FILE]

For each number of server processes (`MCPClientPool(sessions_per_server=n)`, calls round-robin
over the processes) and each load, one task sends cheap `execute_sql` calls back to back for
`--duration` seconds and records their latency, while `--slow` other tasks keep slow queries in
flight (runaway recursive CTEs and big sorts that run into the query timeout, so each one holds a
worker thread and a core for `--timeout-s`). Loads: `idle` (no slow queries) and `slow` (with
them). Cells are interleaved within each repetition and the table shows medians over repetitions.
Then, on a server of its own (query timeout `MEMORY_TIMEOUT_S`), the server's RSS before, at the
peak of and after one large window-function query (`memory` in the JSON; issue 28: the allocator
kept what SQLite freed, 71 -> 346 MiB for good, until the server trimmed it after the call).

Before issue 17's fix a query started on the server's event loop, so a slow single operation
froze every call of that process; now queries run on worker threads and the cheap calls' latency
beside slow ones is bounded by CPU contention, not by the slow queries' duration. Not a unit test.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from bench_mcp_roundtrip import make_db, pct, queries
from common import (  # also puts the repo root on sys.path
    REPO_ROOT,
    Samples,
    add_common_args,
    console,
    load_note,
    machine_info,
    print_table,
    write_json,
)

from skyrl_tool_agent.mcp.pool import MCPClientPool, ServerSpec

SLOW_QUERIES = [
    "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r",
    "SELECT i FROM (WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 50000000) "
    "SELECT i FROM r) ORDER BY random() LIMIT 1",
]
#: ~255 MiB of SQLite heap (the window's sorter; the server's default cap is 256 MiB), ~3 s of CPU.
LARGE_QUERY = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 6000000) "
               "SELECT x, sum(x) OVER (ORDER BY -x ROWS BETWEEN 1000 PRECEDING AND CURRENT ROW) FROM c")
MEMORY_TIMEOUT_S = 30.0


async def measure(pool: MCPClientPool, load: str, args: argparse.Namespace) -> dict[str, Any]:
    """One cell: cheap-call latencies (ms) for `args.duration` s, with or without slow queries."""
    cheap_sqls = queries(1000)
    latencies: list[float] = []
    slow_times: list[float] = []
    errors = 0
    stop = asyncio.Event()

    async def cheap() -> None:
        nonlocal errors
        i = 0
        deadline = time.monotonic() + args.duration
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            result = await pool.call_tool("execute_sql", {"sql": cheap_sqls[i % len(cheap_sqls)]})
            latencies.append((time.perf_counter() - t0) * 1000)
            errors += bool(result.is_error)
            i += 1
        stop.set()

    async def slow(k: int) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await pool.call_tool("execute_sql", {"sql": SLOW_QUERIES[k % len(SLOW_QUERIES)]})
            slow_times.append(time.perf_counter() - t0)

    tasks = [asyncio.create_task(slow(k)) for k in range(args.slow if load == "slow" else 0)]
    if tasks:
        await asyncio.sleep(0.2)  # let the slow queries start first
    await cheap()
    await asyncio.gather(*tasks)
    return {
        "calls": len(latencies),
        "errors": errors,
        "p50_ms": pct(latencies, 0.5),
        "p99_ms": pct(latencies, 0.99),
        "max_ms": max(latencies),
        "slow_answers": len(slow_times),
        "slow_max_s": max(slow_times) if slow_times else float("nan"),
    }


async def measure_memory(spec: ServerSpec) -> dict[str, Any]:
    """RSS (MiB) of a fresh server before, at the peak of and after `LARGE_QUERY`; the next cheap call's answer."""
    pool = MCPClientPool([spec], sessions_per_server=1, call_timeout_s=MEMORY_TIMEOUT_S + 30, startup_timeout_s=600)
    await pool.start()
    try:
        cheap_sql = queries(1)[0]
        await pool.call_tool("execute_sql", {"sql": cheap_sql})
        (pid,) = pool.server_pids()["sqlite"]
        assert pid is not None
        proc = psutil.Process(pid)
        before = proc.memory_info().rss
        peak = [before]
        stop = threading.Event()

        def sample() -> None:  # a thread: the event loop is busy with the call
            while not stop.wait(0.01):
                peak[0] = max(peak[0], proc.memory_info().rss)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            large = await pool.call_tool("execute_sql", {"sql": LARGE_QUERY})
        finally:
            stop.set()
            sampler.join()
        after = proc.memory_info().rss
        cheap = await pool.call_tool("execute_sql", {"sql": cheap_sql})
    finally:
        await pool.close()
    return {
        "rss_before_mib": before / 2**20,
        "rss_peak_mib": peak[0] / 2**20,
        "rss_after_mib": after / 2**20,
        "large_query_error": bool(large.is_error),
        "cheap_call_after_error": bool(cheap.is_error),
    }


async def run(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.sqlite"
        make_db(db)
        server_args = ["-m", "mcp_tools.sqlite_server", "--db", str(db), "--timeout-s", str(args.timeout_s)]
        spec = ServerSpec(name="sqlite", command=sys.executable, args=server_args, cwd=str(REPO_ROOT))
        pools = {
            n: MCPClientPool([spec], sessions_per_server=n, call_timeout_s=args.timeout_s + 30, startup_timeout_s=600)
            for n in args.servers
        }
        for pool in pools.values():
            await pool.start()
        cells = [(n, load) for n in args.servers for load in ("idle", "slow")]
        runs: dict[tuple[int, str], list[dict[str, Any]]] = {cell: [] for cell in cells}
        try:
            for rep in range(args.warmup + args.reps):
                k = rep % len(cells)
                for n, load in cells[k:] + cells[:k]:  # rotate the order, as common.interleaved does
                    result = await measure(pools[n], load, args)
                    if rep >= args.warmup:
                        runs[(n, load)].append(result)
                        console.log(f"rep {rep - args.warmup}: {n} server(s), {load}: {result}")
        finally:
            for pool in pools.values():
                await pool.close()
    out: dict[str, dict[str, Any]] = {}
    for (n, load), results in runs.items():
        cell: dict[str, Any] = {}
        for key in results[0]:
            samples = Samples([float(r[key]) for r in results])
            cell[key] = samples.median
            cell[f"{key}_all"] = samples.values
        out[f"{n}_{load}"] = cell
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.sqlite"
        make_db(db)
        server_args = ["-m", "mcp_tools.sqlite_server", "--db", str(db), "--timeout-s", str(MEMORY_TIMEOUT_S)]
        out["memory"] = await measure_memory(
            ServerSpec(name="sqlite", command=sys.executable, args=server_args, cwd=str(REPO_ROOT)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 4], help="server process counts")
    parser.add_argument("--slow", type=int, default=8, help="concurrent slow queries in the 'slow' load")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of cheap calls per cell")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="the servers' query timeout")
    add_common_args(parser, "bench_sandbox_load", reps=3, warmup=0)
    args = parser.parse_args()
    info = machine_info()
    results = asyncio.run(run(args))
    info_after = machine_info()
    rows = []
    for n in args.servers:
        idle, slow = results[f"{n}_idle"], results[f"{n}_slow"]
        for load, r in (("idle", idle), (f"{args.slow} slow", slow)):
            rows.append(
                [f"{n} server(s), {load}", r["p50_ms"], r["p99_ms"], r["max_ms"], r["calls"] / args.duration,
                 int(r["errors"]), r["slow_max_s"], r["p99_ms"] / idle["p99_ms"]]
            )
    print_table(
        f"Cheap execute_sql latency beside slow queries ({args.duration:g} s per cell, {args.reps} reps, medians; "
        f"query timeout {args.timeout_s:g} s)",
        ["servers, load", "p50 ms", "p99 ms", "max ms", "calls/s", "errors", "slow answer max s", "p99 / idle"],
        rows,
        caption=f"{load_note(info)} before, {info_after['load_average'][0]:g} after",
    )
    mem = results["memory"]
    console.print(
        f"server RSS around one large window query: {mem['rss_before_mib']:.0f} MiB before, "
        f"{mem['rss_peak_mib']:.0f} peak, {mem['rss_after_mib']:.0f} after the call "
        f"(query error: {mem['large_query_error']}, next cheap call error: {mem['cheap_call_after_error']})"
    )
    path = write_json(args.json_out, "bench_sandbox_load", vars(args), results, info)
    if path is not None:
        console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
