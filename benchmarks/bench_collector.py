"""Env steps/s of the `TrajectoryCollector` with an instant policy, at several concurrency levels.

    python benchmarks/bench_collector.py [--tasks 32] [--group-size 8] [--concurrency 1,8,64]
                                         [--reps 5] [--profile] [--json-out FILE]

The agent returns the oracle's turns (list_tables, describe_table, execute_sql, answer) at once:
scripts are built before timing, so this measures the collector, the environment (parsing, MCP tool
calls through the pooled server processes, scoring) and nothing of a model. Tasks are a fixed
stratified subset of the built-in train set (data/processed), `--group-size` episodes each, as in a
GRPO step; the gold-result cache starts empty for every run. Settings otherwise as the trainer's CPU
defaults (one MCP server process), `max_turns` 6 (room for the oracle's 4 turns; the trainer's default
is 3), free-running batching (`deterministic=False`);
the trainer's lockstep mode (`deterministic=True`) is measured as an extra row at the highest level.

For each run the CPU time of this process (collector, event loops, scoring threads) and of the MCP
server processes is recorded, per env step: on 2 cores their sum bounds the throughput. `--profile`
adds a cProfile of one run at the highest concurrency (this process's threads only). Levels are
interleaved within each repetition; the table shows medians. Not a unit test.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402  (also puts the repo root on sys.path)
    REPO_ROOT,
    Samples,
    add_common_args,
    console,
    interleaved,
    load_note,
    machine_info,
    print_table,
    write_json,
)

import psutil  # noqa: E402

from skyrl_tool_agent.config import EnvConfig  # noqa: E402
from skyrl_tool_agent.data.batching import fixed_subset  # noqa: E402
from skyrl_tool_agent.data.tasks import Task, load_tasks  # noqa: E402
from skyrl_tool_agent.env.pools import EnvRuntime  # noqa: E402
from skyrl_tool_agent.rewards.gold_cache import GoldResultCache  # noqa: E402
from skyrl_tool_agent.rollout.agents import Agent, AgentTurn, TurnRequest, oracle_turn_texts  # noqa: E402
from skyrl_tool_agent.rollout.collector import CollectorSettings, TrajectoryCollector  # noqa: E402

BUILTIN = REPO_ROOT / "data" / "processed"
TARGET_STEPS_PER_S = 500.0


class InstantOracle(Agent):
    """Returns each episode's next oracle turn immediately (scripts built once, before timing)."""

    def __init__(self, tasks: Sequence[Task]) -> None:
        self.scripts = {t.task_id: oracle_turn_texts(t) for t in tasks}

    async def act(self, requests: Sequence[TurnRequest]) -> list[AgentTurn]:
        out = []
        for r in requests:
            script = self.scripts[r.task.task_id]
            out.append(AgentTurn(text=script[min(r.turn, len(script) - 1)]))
        return out


def _thread_cpu(proc: psutil.Process) -> dict[int, float]:
    """CPU seconds of each live thread of `proc`, by native thread id."""
    return {t.id: t.user_time + t.system_time for t in proc.threads()}


def _cpu_seconds(procs: Sequence[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


class Runs:
    """One collector run per call, recording throughput and CPU split."""

    def __init__(self, runtime: EnvRuntime, tasks: Sequence[Task], group_size: int, max_turns: int) -> None:
        self.runtime = runtime
        self.tasks = list(tasks)
        self.group_size = group_size
        self.max_turns = max_turns
        self.agent = InstantOracle(tasks)
        self.me = psutil.Process()
        self.servers = [p for p in self.me.children(recursive=True)]
        self.steps: dict[str, Samples] = {}
        self.client_cpu_ms: dict[str, Samples] = {}
        self.server_cpu_ms: dict[str, Samples] = {}
        # This process's CPU per env step, split by thread: the collector's event loop (episodes,
        # parsing, env bookkeeping), the MCP pool's loop thread (client sessions, JSON-RPC), and
        # the rest (reward scoring in asyncio.to_thread workers, which end with each run).
        self.split_ms: dict[str, dict[str, Samples]] = {}
        self.main_tid = threading.get_native_id()
        self.solved: dict[str, float] = {}

    def run(self, key: str, concurrency: int, deterministic: bool) -> float:
        """Collect all episodes once; returns env steps/s (also recorded under `key`)."""
        self.runtime.gold_cache = GoldResultCache(maxsize=self.runtime.config.reward.gold_cache_size)
        settings = CollectorSettings(max_turns=self.max_turns, concurrency=concurrency, max_batch=concurrency,
                                     deterministic=deterministic)
        collector = TrajectoryCollector(self.runtime, self.agent, settings=settings)
        pool_tid = next((t.native_id for t in threading.enumerate() if t.name == "mcp-pool-loop"), None)
        threads0 = _thread_cpu(self.me)
        client0, server0 = self.me.cpu_times(), _cpu_seconds(self.servers)
        trajectories = asyncio.run(collector.collect(self.tasks, self.group_size))
        client1, server1 = self.me.cpu_times(), _cpu_seconds(self.servers)
        threads1 = _thread_cpu(self.me)
        steps = collector.last_stats["env_steps"]
        client = (client1.user + client1.system) - (client0.user + client0.system)
        main = threads1.get(self.main_tid, 0.0) - threads0.get(self.main_tid, 0.0)
        pool = threads1.get(pool_tid, 0.0) - threads0.get(pool_tid, 0.0) if pool_tid else 0.0
        split = self.split_ms.setdefault(key, {"collector loop": Samples(), "MCP pool thread": Samples(),
                                               "scoring threads + other": Samples()})
        split["collector loop"].add(1e3 * main / steps)
        split["MCP pool thread"].add(1e3 * pool / steps)
        split["scoring threads + other"].add(1e3 * max(0.0, client - main - pool) / steps)
        self.steps.setdefault(key, Samples()).add(steps)
        self.client_cpu_ms.setdefault(key, Samples()).add(1e3 * client / steps)
        self.server_cpu_ms.setdefault(key, Samples()).add(1e3 * (server1 - server0) / steps)
        self.solved[key] = sum(t.result.solved for t in trajectories) / len(trajectories)
        return collector.last_stats["env_steps_per_s"]


def profile_run(runs: Runs, concurrency: int, top: int = 20) -> str:
    """cProfile of one run: the collector's thread and, separately, the MCP pool's loop thread."""
    main_prof, pool_prof = cProfile.Profile(), cProfile.Profile()

    async def switch(on: bool) -> None:  # runs on the pool's loop thread: profiles that thread
        pool_prof.enable() if on else pool_prof.disable()

    runs.runtime.servers.pool.run(switch(True))
    main_prof.enable()
    runs.run("profile", concurrency, False)
    main_prof.disable()
    runs.runtime.servers.pool.run(switch(False))
    out = io.StringIO()
    for title, prof in (("collector thread", main_prof), ("MCP pool loop thread", pool_prof)):
        out.write(f"==== cProfile, {title}, concurrency {concurrency} (by own time)\n")
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=32, help="built-in train tasks (fixed stratified subset)")
    parser.add_argument("--group-size", type=int, default=8, help="episodes per task (default 8)")
    parser.add_argument("--concurrency", default="1,8,64", help="comma-separated episodes in flight")
    parser.add_argument("--sessions", type=int, default=1, help="MCP server processes (sessions_per_server)")
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--no-lockstep", action="store_true", help="skip the deterministic (trainer) row")
    parser.add_argument("--profile", action="store_true", help="also cProfile one run at the highest level")
    add_common_args(parser, "bench_collector", reps=5)
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]

    tasks = fixed_subset(load_tasks(BUILTIN / "train.json"), args.tasks, seed=0)
    t0 = time.perf_counter()
    # The exploring 4-turn episode (all tools, db_id passed) these figures were first measured on.
    runtime = EnvRuntime(EnvConfig.exploring(sessions_per_server=args.sessions), BUILTIN / "databases")
    startup_s = time.perf_counter() - t0
    try:
        runs = Runs(runtime, tasks, args.group_size, args.max_turns)
        variants: dict[str, Any] = {f"c{c}": (lambda c=c: runs.run(f"c{c}", c, False)) for c in levels}
        top = max(levels)
        if not args.no_lockstep:
            variants[f"c{top}-lockstep"] = lambda: runs.run(f"c{top}-lockstep", top, True)
        episodes = len(tasks) * args.group_size
        console.print(f"{episodes} episodes per run ({len(tasks)} built-in tasks x {args.group_size}); "
                      f"{args.reps} reps, {args.warmup} warm-up; {args.sessions} MCP server process(es), "
                      f"started in {startup_s:.2f} s")
        rates = interleaved(variants, args.reps, warmup=args.warmup,
                            on_rep=lambda rep, v: console.print(f"  rep {rep + 1}: " + ", ".join(
                                f"{k} {r:,.0f} steps/s" for k, r in v.items())))
        profile_text = profile_run(runs, top) if args.profile else None
    finally:
        runtime.close()

    machine = machine_info()
    rows, results = [], {"episodes_per_run": episodes, "pool_startup_s": startup_s, "levels": {}}
    for key, samples in rates.items():
        steps = runs.steps[key].median
        label = key[1:].replace("-lockstep", ", lockstep (trainer)")
        split = runs.split_ms[key]
        rows.append([label, samples.median, min(samples.values), steps / args.group_size / len(tasks),
                     runs.client_cpu_ms[key].median, *(v.median for v in split.values()),
                     runs.server_cpu_ms[key].median, f"{runs.solved[key]:.0%}"])
        results["levels"][key] = {
            "env_steps_per_s": samples.summary(),
            "env_steps_per_run": steps,
            "client_cpu_ms_per_step": runs.client_cpu_ms[key].summary(),
            "server_cpu_ms_per_step": runs.server_cpu_ms[key].summary(),
            "client_cpu_ms_per_step_by_thread": {k: v.summary() for k, v in split.items()},
            "solved_fraction": runs.solved[key],
        }
    print_table(
        "Collector: env steps/s with an instant oracle policy (medians)",
        ["concurrency", "env steps/s", "min", "turns/ep", "CPU ms/step (this process)", "= collector loop",
         "+ MCP pool thread", "+ scoring, other", "MCP server CPU ms/step", "solved"],
        rows,
        caption=f"target >= {TARGET_STEPS_PER_S:.0f} steps/s at 64; {episodes} episodes/run; {load_note(machine)}",
    )
    if profile_text:
        console.print(profile_text, markup=False, highlight=False)
        results["profile_top"] = profile_text
    settings = {"tasks": len(tasks), "group_size": args.group_size, "concurrency": levels, "reps": args.reps,
                "warmup": args.warmup, "sessions_per_server": args.sessions, "max_turns": args.max_turns,
                "data": "built-in train (data/processed)"}
    path = write_json(args.json_out, "bench_collector", settings, results, machine)
    if path:
        console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
