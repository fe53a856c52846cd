"""Cheap-call latency beside slow queries: does a SQLite MCP server stay responsive under load?

    python benchmarks/bench_sandbox_load.py [--servers 1] [--slow 8 32 64] [--duration S] [--reps R]
                                            [--timeout-s T] [--busy N] [--flood R] [--json-out FILE]

For each number of server processes (`MCPClientPool(sessions_per_server=n)`, calls round-robin
over the processes) and each load, one task sends cheap `execute_sql` calls back to back for
`--duration` seconds and records their latency, while N other tasks keep slow queries in flight
(runaway recursive CTEs and big sorts that run into the query timeout, so each one holds a worker
thread and a core for `--timeout-s`). Loads: `idle` (no slow queries) and, for each N in `--slow`,
N slow calls on servers with the express lane (`call_lanes`, the default) and without it
(`--express-threads 0`: every call waits for one of the 32 main threads, the behaviour before
issue 28's finding 7: behind 32-64 slow calls a `count(*)` waited up to the whole timeout). Cells
are interleaved within each repetition and the table shows medians over repetitions. `--busy N`
runs N busy-loop processes beside it all (a machine shared with other work: session 27's cheap
call, starved of CPU in its express try, answered "timeout"; the `errors` column counts them).
`--flood R`: then, R times on the express server, the largest `--slow` number of slow calls sent
at once and one cheap call 0.3 s later (the scenario of `tests/test_server_lanes.py`'s real-server
test): its wait, and how many of the R were answered with an error.

Then, on a server of its own (query timeout `MEMORY_TIMEOUT_S`, the default 256 MB cap), the
server's RSS before, at the peak of (VmHWM) and after one large window-function query that fits
the cap and one that does not (`memory` in the JSON; issue 28: the allocator kept what SQLite
freed, 71 -> 346 MiB for good, until the server trimmed it after the call; and the peak passed
the cap, up to 455 MiB, until the cap covered the whole process).

Not a unit test.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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

from skyrl_tool_agent.config import MCPServerConfig
from skyrl_tool_agent.mcp.pool import MCPClientPool

SLOW_QUERIES = [
    "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r",
    "SELECT i FROM (WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 50000000) "
    "SELECT i FROM r) ORDER BY random() LIMIT 1",
]
_WINDOW = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT {n}) "
           "SELECT x, sum(x) OVER (ORDER BY -x ROWS BETWEEN 1000 PRECEDING AND CURRENT ROW) FROM c")
#: Window queries (~46 bytes of RSS per row): +206 MiB, within the default 256 MB cap; and past it.
LARGE_QUERIES = {"fits": _WINDOW.format(n=4_500_000), "past_cap": _WINDOW.format(n=12_000_000)}
MEMORY_TIMEOUT_S = 30.0


async def measure(pool: MCPClientPool, load: int, args: argparse.Namespace) -> dict[str, Any]:
    """One cell: cheap-call latencies (ms) for `args.duration` s beside `load` slow calls in flight."""
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

    tasks = [asyncio.create_task(slow(k)) for k in range(load)]
    if tasks:
        await asyncio.sleep(0.2)  # let the slow queries start first
    await cheap()
    await asyncio.gather(*tasks)
    return {
        "calls": len(latencies),
        "errors": errors,
        "p50_ms": pct(latencies, 0.5),
        "p95_ms": pct(latencies, 0.95),
        "p99_ms": pct(latencies, 0.99),
        "max_ms": max(latencies),
        "slow_answers": len(slow_times),
        "slow_max_s": max(slow_times) if slow_times else float("nan"),
    }


async def measure_floods(pool: MCPClientPool, load: int, floods: int) -> dict[str, Any]:
    """`floods` times: `load` slow calls at once, then one cheap call 0.3 s later; its waits (s)."""
    waits: list[float] = []
    errors = 0
    for _ in range(floods):
        slow = [asyncio.create_task(pool.call_tool("execute_sql", {"sql": SLOW_QUERIES[k % len(SLOW_QUERIES)]}))
                for k in range(load)]
        await asyncio.sleep(0.3)
        t0 = time.perf_counter()
        result = await pool.call_tool("execute_sql", {"sql": queries(1)[0]})
        waits.append(time.perf_counter() - t0)
        errors += bool(result.is_error)
        await asyncio.gather(*slow)
    return {"floods": floods, "slow_calls": load, "errors": errors, "waits_s": waits,
            "p50_s": pct(waits, 0.5), "max_s": max(waits)}


def _vm_mib(pid: int, field: str) -> float:
    """VmRSS (now) or VmHWM (peak since /proc/<pid>/clear_refs was last told 5) of a process, in MiB."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(text.split(f"{field}:")[1].split()[0]) / 1024


async def measure_memory(spec: MCPServerConfig) -> dict[str, Any]:
    """RSS (MiB) of a fresh server before, at the peak of and after each of `LARGE_QUERIES`; the
    answers, and whether the next cheap call answers."""
    pool = MCPClientPool([spec], sessions_per_server=1, call_timeout_s=MEMORY_TIMEOUT_S + 30, startup_timeout_s=600)
    await pool.start()
    out: dict[str, Any] = {}
    try:
        cheap_sql = queries(1)[0]
        await pool.call_tool("execute_sql", {"sql": cheap_sql})
        (pid,) = pool.server_pids()["sqlite"]
        assert pid is not None
        for name, sql in LARGE_QUERIES.items():
            before = _vm_mib(pid, "VmRSS")
            Path(f"/proc/{pid}/clear_refs").write_text("5")
            large = await pool.call_tool("execute_sql", {"sql": sql})
            peak, after = _vm_mib(pid, "VmHWM"), _vm_mib(pid, "VmRSS")
            cheap = await pool.call_tool("execute_sql", {"sql": cheap_sql})
            out[name] = {"rss_before_mib": before, "rss_peak_mib": peak, "rss_after_mib": after,
                         "answer": large.text[:80], "cheap_call_after_error": bool(cheap.is_error)}
    finally:
        await pool.close()
    return out


def _spec(db: Path, timeout_s: float, *extra: str) -> MCPServerConfig:
    args = ["-m", "mcp_tools.sqlite_server", "--db", str(db), "--timeout-s", str(timeout_s), *extra]
    return MCPServerConfig(name="sqlite", command=sys.executable, args=args, cwd=str(REPO_ROOT))


#: Server variants: the express lane on (the default) and off (every call waits for a main thread).
LANES = {"express": (), "main_only": ("--express-threads", "0")}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.sqlite"
        make_db(db)
        pools = {
            (n, lanes): MCPClientPool([_spec(db, args.timeout_s, *extra)], sessions_per_server=n,
                                      call_timeout_s=3 * args.timeout_s + 30, startup_timeout_s=600)
            for n in args.servers for lanes, extra in LANES.items()
        }
        for pool in pools.values():
            await pool.start()
        # (servers, lanes, slow calls in flight); idle only once per server count.
        cells = [(n, "express", 0) for n in args.servers] + [
            (n, lanes, load) for n in args.servers for load in args.slow for lanes in LANES]
        runs: dict[tuple[int, str, int], list[dict[str, Any]]] = {cell: [] for cell in cells}
        try:
            for rep in range(args.warmup + args.reps):
                k = rep % len(cells)
                for cell in cells[k:] + cells[:k]:  # rotate the order, as common.interleaved does
                    result = await measure(pools[cell[:2]], cell[2], args)
                    if rep >= args.warmup:
                        runs[cell].append(result)
                        console.log(f"rep {rep - args.warmup}: {cell}: {result}")
            flood = (await measure_floods(pools[(args.servers[0], "express")], max(args.slow), args.flood)
                     if args.flood else None)
        finally:
            for pool in pools.values():
                await pool.close()
        out: dict[str, Any] = {}
        for (n, lanes, load), results in runs.items():
            cell: dict[str, Any] = {}
            for key in results[0]:
                samples = Samples([float(r[key]) for r in results])
                cell[key] = samples.median
                cell[f"{key}_all"] = samples.values
            out[f"{n}_{lanes}_{load}"] = cell
        if flood is not None:
            out["flood"] = flood
        out["memory"] = await measure_memory(_spec(db, MEMORY_TIMEOUT_S))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, nargs="+", default=[1], help="server process counts")
    parser.add_argument("--slow", type=int, nargs="+", default=[8, 32, 64], help="slow calls in flight, per load")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of cheap calls per cell")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="the servers' query timeout")
    add_common_args(parser, "bench_sandbox_load", reps=3, warmup=0)
    parser.add_argument("--busy", type=int, default=0, help="busy-loop processes running beside the benchmark")
    parser.add_argument("--flood", type=int, default=0, help="floods of slow calls, each with one cheap call behind")
    args = parser.parse_args()
    info = machine_info()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        results = asyncio.run(run(args))
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    info_after = machine_info()
    rows = []
    for n in args.servers:
        idle = results[f"{n}_express_0"]
        for name, r in [("idle", idle)] + [(f"{load} slow, {lanes}", results[f"{n}_{lanes}_{load}"])
                                           for load in args.slow for lanes in LANES]:
            rows.append([f"{n} server(s), {name}", r["p50_ms"], r["p95_ms"], r["p99_ms"], r["max_ms"],
                         r["calls"] / args.duration, int(r["errors"]), r["slow_max_s"], r["p95_ms"] / idle["p95_ms"]])
    print_table(
        f"Cheap execute_sql latency beside slow queries ({args.duration:g} s per cell, {args.reps} reps, medians; "
        f"query timeout {args.timeout_s:g} s)",
        ["servers, load", "p50 ms", "p95 ms", "p99 ms", "max ms", "calls/s", "errors", "slow answer max s",
         "p95 / idle"],
        rows,
        caption=f"{load_note(info)} before, {info_after['load_average'][0]:g} after",
    )
    if "flood" in results:
        f = results["flood"]
        console.print(f"{f['floods']} floods of {f['slow_calls']} slow calls, a cheap call 0.3 s behind each: answered with "
                      f"an error {f['errors']} times; its wait median {f['p50_s']:.2f} s, longest {f['max_s']:.2f} s")
    for name, mem in results["memory"].items():
        console.print(
            f"server RSS around one large window query ({name}): {mem['rss_before_mib']:.0f} MiB before, "
            f"{mem['rss_peak_mib']:.0f} peak, {mem['rss_after_mib']:.0f} after the call; answer "
            f"{mem['answer'][:60]!r}; next cheap call error: {mem['cheap_call_after_error']}"
        )
    path = write_json(args.json_out, "bench_sandbox_load", vars(args), results, info)
    if path is not None:
        console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
