"""A writable third-party MCP server's isolation against the project's own server: README's "Bring
your own MCP server" example, the oracle on the 39 built-in dev tasks of the `library` database.

    python benchmarks/bench_isolation.py [--reps 3] [--warmup 0] [--db library] [--json-out FILE]

Variants, each one `skyrl-tool-agent eval --policy oracle` process as a user runs it (a fresh CLI per
repetition, interleaved, the order rotating):

- `own`: the project's own server (`mcp_tools.sqlite_server`, read-only, shared by every episode);
- `reference-writable`: the public reference server `mcp-server-sqlite` (from its own venv,
  tests/.third_party/, built on first use as tests/fixtures/third_party.py does) on the database,
  declared writable (`--mcp-writable`): its warm pool, every episode on its own state;
- `reference-shared`: the same server not declared writable (one process shared by every episode,
  no isolation): what the server itself costs, for reference.

Every variant runs `env.schema_in_prompt=false` (the reference server has no schema tool), so the
episodes are the same: the oracle's one query call and its answer. Per run: seconds per episode (the
evaluation's own `seconds` over its episodes, the servers' start excluded), the peak RSS of the CLI's
process tree (sampled every 20 ms; the servers included) and the most server processes alive at once.
Goal (issue 49): reference-writable per episode <= 1.5x own, peak RSS <= 2x, processes <= the pool
size (`env.isolation_pool_size`, null = the cores). Not a unit test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402  (also puts the repo root on sys.path)
    REPO_ROOT,
    Samples,
    add_common_args,
    console,
    load_note,
    machine_info,
    paired_ratios,
    print_table,
    write_json,
)

import psutil  # noqa: E402

from skyrl_tool_agent.config.base import default_of  # noqa: E402
from tests.fixtures.third_party import mcp_server_sqlite  # noqa: E402

DB_ROOT = REPO_ROOT / "data" / "processed" / "databases"
DEV = REPO_ROOT / "data" / "processed" / "dev.json"
TEXT_ERRORS = "'^(Database )?[Ee]rror:'"
SERVER_MARKERS = ("mcp-server-sqlite", "mcp_tools.sqlite_server")


class TreeSampler:
    """Peak RSS of a process and its descendants, and the most server processes among them."""

    def __init__(self, pid: int, interval_s: float = 0.02) -> None:
        self.root = psutil.Process(pid)
        self.interval_s = interval_s
        self.peak_rss = 0
        self.peak_servers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        rss, servers = 0, 0
        try:
            root_cmdline = self.root.cmdline()
        except psutil.Error:
            return
        for proc in procs:
            try:
                rss += proc.memory_info().rss
                # the CLI's command line names the server too (--mcp-server), and so does a child it
                # forks: a server is a process with a command line of its own
                cmdline = proc.cmdline()
                if cmdline != root_cmdline and any(marker in " ".join(cmdline) for marker in SERVER_MARKERS):
                    servers += 1
            except psutil.Error:
                continue
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_servers = max(self.peak_servers, servers)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def variant_flags(name: str, database: Path, exe: Path) -> list[str]:
    common = ["--set", "env.schema_in_prompt=false"]
    if name == "own":
        return common
    flags = ["--mcp-server", f"ref={exe} --db-path {database}",
             "--set", "env.tool_map={execute_sql: {tool: read_query, args: {sql: query}}}",
             "--set", f"env.mcp_servers.0.error_pattern={TEXT_ERRORS}", *common]
    if name == "reference-writable":
        flags += ["--mcp-writable", f"ref={database}"]
    return flags


def run_once(name: str, tasks: Path, database: Path, exe: Path, work: Path) -> dict[str, float]:
    out = work / f"{name}-{time.monotonic_ns()}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(WANDB_MODE="disabled", WEAVE_DISABLED="true", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "skyrl_tool_agent.commands.main", "eval", "--policy", "oracle",
           "--set", f"training.data.dev_file={tasks}", "--set", f"training.data.db_root={DB_ROOT}",
           *variant_flags(name, database, exe), "--output-dir", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with TreeSampler(proc.pid) as sampler:
        log, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: the eval failed (exit {proc.returncode}):\n{log[-3000:]}")
    results = json.loads((out / "results.json").read_text())
    if results["execution_accuracy"] != 1.0 or results["infra_errors"]:
        raise SystemExit(f"{name}: the oracle did not score 1.0: {results}")
    return {"s_per_episode": results["seconds"] / results["episodes"], "peak_rss_mib": sampler.peak_rss / 2**20,
            "server_processes": float(sampler.peak_servers)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--db", default="library", help="the built-in database whose dev tasks run (default library)")
    add_common_args(parser, "bench_isolation", reps=3, warmup=0)
    args = parser.parse_args()
    exe = mcp_server_sqlite()
    database = DB_ROOT / args.db / f"{args.db}.sqlite"
    selected = [t for t in json.loads(DEV.read_text()) if t["db_id"] == args.db]
    names = ["own", "reference-writable", "reference-shared"]
    samples: dict[str, dict[str, Samples]] = {n: {k: Samples() for k in ("s_per_episode", "peak_rss_mib",
                                                                         "server_processes")} for n in names}
    with tempfile.TemporaryDirectory(prefix="bench-isolation-") as tmp:
        work = Path(tmp)
        tasks = work / "tasks.json"
        tasks.write_text(json.dumps(selected))
        for rep in range(args.warmup + args.reps):
            k = rep % len(names)
            for name in names[k:] + names[:k]:
                measured = run_once(name, tasks, database, exe, work)
                console.print(f"rep {rep} {name}: " + ", ".join(f"{key} {value:.3g}" for key, value in measured.items()))
                if rep >= args.warmup:
                    for key, value in measured.items():
                        samples[name][key].add(value)
    pool_size = default_of_pool()
    info = machine_info()
    ratios = {key: paired_ratios(samples["reference-writable"][key], samples["own"][key]).median
              for key in ("s_per_episode", "peak_rss_mib")}
    rows = [[name, samples[name]["s_per_episode"].median, samples[name]["peak_rss_mib"].median,
             samples[name]["server_processes"].median] for name in names]
    print_table(f"oracle on the {len(selected)} {args.db} dev tasks, medians of {args.reps} interleaved runs",
                ["variant", "s / episode", "peak RSS (MiB)", "server processes"], rows,
                caption=f"writable / own: time {ratios['s_per_episode']:.2f}x, peak RSS {ratios['peak_rss_mib']:.2f}x; "
                        f"pool size {pool_size}; {load_note(info)}")
    results = {name: {key: value.summary() for key, value in samples[name].items()} for name in names}
    results["writable_over_own"] = ratios
    results["pool_size"] = pool_size
    results["goal"] = {"time_ratio_max": 1.5, "rss_ratio_max": 2.0,
                       "met": ratios["s_per_episode"] <= 1.5 and ratios["peak_rss_mib"] <= 2.0
                       and samples["reference-writable"]["server_processes"].values
                       and max(samples["reference-writable"]["server_processes"].values) <= pool_size}
    write_json(args.json_out, "bench_isolation", {"db": args.db, "tasks": len(selected), "reps": args.reps,
                                                 "warmup": args.warmup}, results, info)


def default_of_pool() -> int:
    from skyrl_tool_agent.config.env import EnvConfig

    return default_of(EnvConfig, "isolation_pool_size") or os.cpu_count() or 1


if __name__ == "__main__":
    main()
