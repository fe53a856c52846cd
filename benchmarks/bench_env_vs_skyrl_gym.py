"""Episodes/s of our `MCPToolEnvironment` vs skyrl-gym's own `text2sql` environment, same episodes.

    python benchmarks/bench_env_vs_skyrl_gym.py [--data spider|builtin] [--tasks N] [--reps R]
                                                [--concurrency 1,16] [--json-out FILE]

Both environments play scripted oracle episodes on the same databases with the same gold SQL,
through the skyrl-gym API (`init`, then `step(action)` until done, scored at the end):

  ours oracle     MCPToolEnvironment, 4 turns: list_tables, describe_table (gold tables, one turn),
                  execute_sql(gold), <answer>gold</answer>  (= OracleAgent), tools over MCP
                  (real server processes, pooled, sandboxed), reward = execution + shaping terms
  ours like-for-like
                  MCPToolEnvironment, 2 turns: execute_sql(gold), <answer>gold</answer>
  skyrl-gym       skyrl_gym text2sql (SQLEnv), 2 turns: <sql>gold</sql>, then
                  <think>..</think><solution>gold</solution>; in-process sqlite3, no sandbox, no schema
                  tools; reward re-runs the gold query every episode

Time per episode includes constructing the env, `init` and every `step` (scoring included). Our
MCP pool is started once, before timing (startup reported separately): SkyRL-train keeps it per
process. Our gold-result cache is emptied before every repetition, and each task is played once per
repetition (`--group-size 1`), so every episode pays for its gold query like skyrl-gym's does; in
GRPO training the G-1 other episodes of a group hit the cache.

With `--concurrency` values above 1, episodes also run C at a time: ours as asyncio tasks over
`astep` (tool calls go to the pool's event loop), skyrl-gym's `step` on a C-thread pool, which is how
SkyRL-train's generator runs synchronous envs. Variants are interleaved within each repetition; the
table shows medians over repetitions and the median of per-repetition ratios.

Besides wall time, each run records CPU time: this process plus our MCP server process(es), so
our server's work is counted. It is steadier than wall time on a shared machine and shows the cost
when many episodes compete for the cores.

A second table breaks our oracle episode down into its parts (same tasks, medians), to show where the
time goes, including the CPU cost of one MCP call on each side of the pipe against the same tool
body run in-process. Not a unit test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
    paired_ratios,
    print_table,
    timed,
    write_json,
)

import psutil  # noqa: E402
import skyrl_gym  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from mcp_tools.sqlite_catalog import Catalog  # noqa: E402
from mcp_tools.sqlite_server import SqliteTools  # noqa: E402

from skyrl_tool_agent.config import EnvConfig  # noqa: E402
from skyrl_tool_agent.data.batching import fixed_subset  # noqa: E402
from skyrl_tool_agent.data.spider import load_spider, spider_db_root  # noqa: E402
from skyrl_tool_agent.data.tasks import Task, db_path_for, load_tasks, task_user_message  # noqa: E402
from skyrl_tool_agent.env.environment import MCPToolEnvironment  # noqa: E402
from skyrl_tool_agent.env.parsing import parse_turn  # noqa: E402
from skyrl_tool_agent.env.pools import EnvRuntime  # noqa: E402
from skyrl_tool_agent.rewards.execution import compare_execution, has_top_level_order_by  # noqa: E402
from skyrl_tool_agent.rewards.gold_cache import GoldResultCache  # noqa: E402
from skyrl_tool_agent.rewards.partial import partial_credit  # noqa: E402
from skyrl_tool_agent.rewards.rubric import score_answer  # noqa: E402
from skyrl_tool_agent.rollout.agents import oracle_turn_texts  # noqa: E402

DEFAULT_SPIDER_ROOT = REPO_ROOT.parent / "shared" / "spider"
BUILTIN_ROOT = REPO_ROOT / "data" / "processed"
MAX_TURNS = 6


# ----------------------------------------------------------------------------- episodes


def load_benchmark_tasks(data: str, n: int, spider_root: Path) -> tuple[list[Task], Path, str]:
    """(tasks, db_root, description): a fixed stratified subset of Spider dev or the built-in dev set."""
    if data == "auto":
        data = "spider" if (spider_root / "dev.json").is_file() else "builtin"
    if data == "spider":
        tasks = load_spider(spider_root, "dev").tasks
        return fixed_subset(tasks, n, seed=0), spider_db_root(spider_root), f"Spider dev ({spider_root})"
    tasks = load_tasks(BUILTIN_ROOT / "dev.json")
    return fixed_subset(tasks, n, seed=0), BUILTIN_ROOT / "databases", "built-in dev (data/processed)"


def skyrl_layout(db_root: Path, tmp: Path) -> Path:
    """A directory D with D/spider/database -> db_root (a symlink): what SQLEnv(data='spider') reads."""
    (tmp / "spider").mkdir(parents=True, exist_ok=True)
    link = tmp / "spider" / "database"
    if not link.exists():
        os.symlink(db_root.resolve(), link)
    return tmp


def _cpu(proc: psutil.Process) -> float:
    """CPU seconds (user + system) of a process so far; 0 if it has gone."""
    try:
        t = proc.cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return t.user + t.system


class Episodes:
    """The three episode kinds over one task list, sequential or C at a time."""

    def __init__(self, tasks: Sequence[Task], runtime: EnvRuntime, skyrl_db_path: Path, group_size: int) -> None:
        self.tasks = [t for t in tasks for _ in range(group_size)]
        self.runtime = runtime
        self.skyrl_config = OmegaConf.create({"db_path": str(skyrl_db_path)})
        # Actions are built before timing: the agent's cost is not the environment's.
        self.oracle = {t.task_id: oracle_turn_texts(t) for t in tasks}
        self.like = {t.task_id: oracle_turn_texts(t)[-2:] for t in tasks}
        self.skyrl = {
            t.task_id: [f"<sql>{t.gold_sql}</sql>", f"<think>The query ran.</think><solution>{t.gold_sql}</solution>"]
            for t in tasks
        }
        self.rewards: dict[str, list[float]] = {}
        # CPU seconds of this process + the MCP server processes per run: steadier than wall time
        # on a loaded machine, and it counts our server's work, which wall time alone hides.
        self.cpu: dict[str, Samples] = {}
        self._me = psutil.Process()
        self._servers = self._me.children(recursive=True)

    def _cpu_now(self) -> float:
        return _cpu(self._me) + sum(_cpu(p) for p in self._servers)

    def _fresh_cache(self) -> None:
        self.runtime.gold_cache = GoldResultCache(maxsize=self.runtime.config.reward.gold_cache_size)

    def ours_env(self, task: Task) -> MCPToolEnvironment:
        extras = {"reward_spec": {"ground_truth": task.gold_sql}, "db_id": task.db_id, "max_turns": MAX_TURNS}
        env = MCPToolEnvironment(extras=extras, runtime=self.runtime)
        env.init([task_user_message(task.db_id, task.question)])
        return env

    def skyrl_env(self, task: Task) -> Any:
        extras = {"reward_spec": {"ground_truth": task.gold_sql}, "db_id": task.db_id, "data": "spider",
                  "max_turns": MAX_TURNS}
        env = skyrl_gym.make("text2sql", env_config=self.skyrl_config, extras=extras)
        env.init([task_user_message(task.db_id, task.question)])
        return env

    def _play_sync(self, env: Any, actions: Sequence[str]) -> float:
        for action in actions:
            out = env.step(action)
            if out["done"]:
                return float(out["reward"])
        return 0.0

    async def _play_async(self, env: MCPToolEnvironment, actions: Sequence[str]) -> float:
        for action in actions:
            out = await env.astep(action)
            if out["done"]:
                return float(out["reward"])
        return 0.0

    def run(self, kind: str, concurrency: int) -> float:
        """Play every episode of `kind` ('ours_oracle', 'ours_like', 'skyrl_gym'); returns seconds."""
        if kind.startswith("ours"):
            self._fresh_cache()
        script = {"ours_oracle": self.oracle, "ours_like": self.like, "skyrl_gym": self.skyrl}[kind]
        make: Callable[[Task], Any] = self.skyrl_env if kind == "skyrl_gym" else self.ours_env
        rewards: list[float] = []

        def sequential() -> None:
            for task in self.tasks:
                rewards.append(self._play_sync(make(task), script[task.task_id]))

        def threaded() -> None:
            def one(task: Task) -> float:
                return self._play_sync(make(task), script[task.task_id])

            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                rewards.extend(pool.map(one, self.tasks))

        async def gathered() -> None:
            semaphore = asyncio.Semaphore(concurrency)

            async def one(task: Task) -> float:
                async with semaphore:
                    return await self._play_async(self.ours_env(task), script[task.task_id])

            rewards.extend(await asyncio.gather(*(one(t) for t in self.tasks)))

        cpu0 = self._cpu_now()
        if concurrency == 1:
            seconds = timed(sequential)
        elif kind == "skyrl_gym":
            seconds = timed(threaded)
        else:
            seconds = timed(lambda: asyncio.run(gathered()))
        self.cpu.setdefault(f"{kind}@{concurrency}", Samples()).add(self._cpu_now() - cpu0)
        self.rewards[f"{kind}@{concurrency}"] = rewards
        return seconds


# ----------------------------------------------------------------------------- breakdown


def breakdown(episodes: Episodes, db_root: Path, reps: int) -> dict[str, tuple[Samples, str]]:
    """Where our oracle episode's time goes: each part timed in isolation on the same tasks (medians),
    plus what one MCP call costs in CPU on each side of the pipe, against the same tool in-process."""
    runtime, tasks = episodes.runtime, episodes.tasks
    style = runtime.settings.tool_call_format

    def parsed(task: Task) -> list[Any]:
        return [parse_turn(a, runtime.tool_arg_schemas, style=style, db_id=task.db_id)
                for a in episodes.oracle[task.task_id]]

    tool_calls = {t.task_id: [c for p in parsed(t) for c in p.tool_calls] for t in tasks}
    calls = [(c.name, c.arguments) for t in tasks for c in tool_calls[t.task_id]]

    def per_episode(fn: Callable[[Task], Any]) -> Callable[[], float]:
        return lambda: 1e3 * timed(lambda: [fn(t) for t in tasks]) / len(tasks)

    me = psutil.Process()
    servers = me.children(recursive=True)
    cpu_client, cpu_server = Samples(), Samples()

    def mcp_calls() -> float:  # ms per call, sequential, as the sync `step` makes them
        c0, s0 = _cpu(me), sum(_cpu(p) for p in servers)
        seconds = timed(lambda: [runtime.call_tools_sync([(name, args)]) for name, args in calls])
        cpu_client.add(1e3 * (_cpu(me) - c0) / len(calls))
        cpu_server.add(1e3 * (sum(_cpu(p) for p in servers) - s0) / len(calls))
        return 1e3 * seconds / len(calls)

    catalog = Catalog(db_root=db_root)
    tools = SqliteTools(catalog, timeout_s=5.0, max_rows=200, max_chars=8000)

    async def in_process() -> None:
        for name, args in calls:
            await getattr(tools, name)(**args)

    cache = GoldResultCache()
    parts: dict[str, Callable[[], float]] = {
        "env construct + init": per_episode(episodes.ours_env),
        "parse the 4 turns": per_episode(parsed),
        "tool calls over MCP (3-4 sequential)": per_episode(
            lambda t: [runtime.call_tools_sync([(c.name, c.arguments)]) for c in tool_calls[t.task_id]]),
        "score_answer (the whole reward)": per_episode(
            lambda t: score_answer(t.gold_sql, t.gold_sql, db_path_for(db_root, t.db_id), format_ok=True,
                                   rubric=runtime.settings.rubric, cache=cache)),
        "  compare_execution (gold cached)": per_episode(
            lambda t: compare_execution(t.gold_sql, t.gold_sql, db_path_for(db_root, t.db_id), cache=cache)),
        "    has_top_level_order_by(gold) (sqlglot)": per_episode(lambda t: has_top_level_order_by(t.gold_sql)),
        "  partial_credit (sqlglot; weight 0 on a match)": per_episode(
            lambda t: partial_credit(t.gold_sql, t.gold_sql)),
        "one MCP call, wall": mcp_calls,
        "one call of the same tool in-process (no MCP)": lambda: 1e3 * timed(lambda: asyncio.run(in_process())) / len(calls),
    }
    try:
        measured = interleaved(parts, reps, warmup=1)
    finally:
        catalog.close()
    out = {k: (v, "per call" if k.startswith("one ") else "per episode") for k, v in measured.items()}
    out["one MCP call, client CPU (this process)"] = (cpu_client, "per call")
    out["one MCP call, server CPU (server process)"] = (cpu_server, "per call")
    return out


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", choices=["auto", "spider", "builtin"], default="auto",
                        help="task source; auto = Spider dev when --spider-root exists, else the built-in dev set")
    parser.add_argument("--spider-root", type=Path, default=DEFAULT_SPIDER_ROOT)
    parser.add_argument("--tasks", type=int, default=100, help="tasks (a fixed stratified subset)")
    parser.add_argument("--group-size", type=int, default=1, help="episodes per task and repetition")
    parser.add_argument("--concurrency", default="1,16", help="comma-separated episodes in flight")
    parser.add_argument("--no-breakdown", action="store_true", help="skip the where-the-time-goes table")
    add_common_args(parser, "bench_env_vs_skyrl_gym", reps=5)
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]

    tasks, db_root, source = load_benchmark_tasks(args.data, args.tasks, args.spider_root)
    with tempfile.TemporaryDirectory(prefix="bench_env_") as tmp:
        skyrl_db_path = skyrl_layout(db_root, Path(tmp))
        startup = Samples()
        runtime = None
        try:
            t0 = time.perf_counter()
            # The exploring 4-turn episode (all tools, db_id passed) these figures were first measured on.
            runtime = EnvRuntime(EnvConfig.exploring(), db_root)
            startup.add(time.perf_counter() - t0)
            episodes = Episodes(tasks, runtime, skyrl_db_path, args.group_size)
            n = len(episodes.tasks)
            variants = {
                f"{kind}@{c}": (lambda kind=kind, c=c: episodes.run(kind, c))
                for c in levels
                for kind in ("ours_oracle", "ours_like", "skyrl_gym")
            }
            console.print(f"{n} episodes per variant and repetition ({source}); {args.reps} reps, "
                          f"{args.warmup} warm-up; pool startup {startup.median:.2f} s")
            seconds = interleaved(
                variants, args.reps, warmup=args.warmup,
                on_rep=lambda rep, v: console.print(f"  rep {rep + 1}: " + ", ".join(
                    f"{k} {1e3 * s / n:.2f} ms/ep" for k, s in v.items())),
            )
            parts = None if args.no_breakdown else breakdown(episodes, db_root, max(3, args.reps // 2))
        finally:
            if runtime is not None:
                runtime.close()

    machine = machine_info()
    rows, results = [], {"pool_startup_s": startup.summary(), "episodes_per_variant": n, "variants": {}}
    for c in levels:
        base = seconds[f"skyrl_gym@{c}"]
        for kind, label in (("skyrl_gym", "skyrl-gym text2sql"), ("ours_oracle", "ours, oracle (4 turns)"),
                            ("ours_like", "ours, like-for-like (2 turns)")):
            s = seconds[f"{kind}@{c}"]
            rel = paired_ratios(s, base)
            cpu = episodes.cpu[f"{kind}@{c}"]
            cpu_rel = paired_ratios(cpu, episodes.cpu[f"skyrl_gym@{c}"])
            solved = sum(r >= 1.0 for r in episodes.rewards[f"{kind}@{c}"]) / n
            ms = Samples([1e3 * v / n for v in s.values])
            cpu_ms = Samples([1e3 * v / n for v in cpu.values])
            rows.append([f"{label} @ {c}", ms.median, n / s.median, rel.median, cpu_ms.median, cpu_rel.median,
                         f"{solved:.0%}"])
            results["variants"][f"{kind}@{c}"] = {
                "ms_per_episode": ms.summary(),
                "episodes_per_s": n / s.median,
                "time_ratio_vs_skyrl_gym": rel.summary(),
                "cpu_ms_per_episode": cpu_ms.summary(),
                "cpu_ratio_vs_skyrl_gym": cpu_rel.summary(),
                "solved_fraction": solved,
            }
    print_table(
        "Environment: time per episode (medians)",
        ["variant @ concurrency", "ms / episode", "episodes / s", "time vs skyrl-gym", "CPU ms / episode",
         "CPU vs skyrl-gym", "reward 1"],
        rows,
        caption=f"{source}, {n} episodes x {args.reps} reps; {load_note(machine)}",
    )
    if parts is not None:
        print_table("Where our oracle episode's time goes (medians, each part timed in isolation)",
                    ["part", "ms", "per"], [[k, v.median, unit] for k, (v, unit) in parts.items()])
        results["breakdown_ms"] = {k: {"per": unit, **v.summary()} for k, (v, unit) in parts.items()}
    settings = {"data": source, "tasks": len(tasks), "group_size": args.group_size, "concurrency": levels,
                "reps": args.reps, "warmup": args.warmup, "max_turns": MAX_TURNS}
    path = write_json(args.json_out, "bench_env_vs_skyrl_gym", settings, results, machine)
    if path:
        console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
