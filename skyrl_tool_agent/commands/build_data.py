"""Build the built-in text-to-SQL dataset (SQLite databases + train.json / dev.json), or export
tasks for SkyRL-train.

    skyrl-tool-agent build-data [--output-dir DIR] [--seed 0]
    skyrl-tool-agent build-data --export skyrl-parquet OUT_DIR [--spider-root DIR] [--max-turns N]
    python training/scripts/build_data.py ...          # the same command

DIR defaults to where the built-in data is read from: a source checkout's data/processed, else the
cache entry ($SKYRL_TOOL_AGENT_CACHE or ~/.cache/skyrl_tool_agent, builtin/...) that training and
evaluation would otherwise build on first use. Deterministic: the same seed rewrites byte-identical
files. Optionally also reports the Spider figures (`--spider-root ../shared/spider`), which are
read in place, never copied.

`--export skyrl-parquet OUT_DIR` builds nothing: it writes OUT_DIR/train.parquet and
OUT_DIR/validation.parquet in SkyRL-train's dataset shape for `environment.env_class=mcp_tool_env`
(skyrl_tool_agent/data/export.py; docs/skyrl_train.md). The rows are the built-in train.json and
dev.json tasks (read where training reads them), or, with `--spider-root`, Spider's train and dev
questions whose database is present. Each row names its database root as an absolute path of this
machine: export on the machine that trains.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from pathlib import Path

from skyrl_tool_agent.commands._args import add_output_dir, new_parser

EXPORT_FORMATS = ("skyrl-parquet",)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from skyrl_tool_agent.config.base import default_of
    from skyrl_tool_agent.config.grpo import GRPOConfig
    from skyrl_tool_agent.data.builtin.location import default_output_dir

    parser = new_parser(__doc__, prog)
    add_output_dir(parser, f"output folder (default {default_output_dir()})",
                   legacy=("--out",))
    parser.add_argument("--seed", type=int, default=None, help="generator seed (default 0)")
    parser.add_argument("--spider-root", type=Path, default=None,
                        help="also summarise Spider dev/train found here (e.g. ../shared/spider); "
                             "with --export, export Spider instead of the built-in tasks")
    parser.add_argument("--export", nargs=2, metavar=("FORMAT", "OUT_DIR"), default=None,
                        help=f"write tasks for another trainer instead of building; FORMAT: {', '.join(EXPORT_FORMATS)}")
    parser.add_argument("--max-turns", type=int, default=None,
                        help="with --export: the rows' max_turns (default: grpo.max_turns's, "
                             f"{default_of(GRPOConfig, 'max_turns')})")
    return parser


def export_skyrl_parquet(out_dir: Path, spider_root: Path | None, max_turns: int) -> dict[str, object]:
    """Write the built-in (or Spider) tasks as SkyRL-train parquet; returns a summary."""
    from skyrl_tool_agent.data.export import write_skyrl_parquet
    from skyrl_tool_agent.data.tasks import Task

    splits: dict[str, list[Task]]
    if spider_root is None:
        from skyrl_tool_agent.data.builtin.location import DB_DIR, DEV_FILE, TRAIN_FILE, builtin_data_dir
        from skyrl_tool_agent.data.tasks import load_tasks

        data_dir = builtin_data_dir()
        splits = {"train": load_tasks(data_dir / TRAIN_FILE), "validation": load_tasks(data_dir / DEV_FILE)}
        db_root = data_dir / DB_DIR
    else:
        from skyrl_tool_agent.data.spider import load_spider, spider_db_root

        splits = {"train": load_spider(spider_root, "train").tasks, "validation": load_spider(spider_root, "dev").tasks}
        db_root = spider_db_root(spider_root)
    paths = write_skyrl_parquet(splits, out_dir, db_root=db_root, max_turns=max_turns)
    return {"db_root": str(db_root.resolve()), "max_turns": max_turns,
            **{split: {"rows": len(splits[split]), "path": str(path)} for split, path in paths.items()}}


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    from skyrl_tool_agent.config.errors import cli_main_guard

    if args.export is not None:
        fmt, out_dir = args.export
        if fmt not in EXPORT_FORMATS:
            parser.error(f"--export: unknown format {fmt!r} (choose from {', '.join(EXPORT_FORMATS)})")
        if args.output_dir is not None or args.seed is not None:
            parser.error("--export reads the built-in data where training does; --output-dir and --seed build it")
        if args.max_turns is not None and args.max_turns < 1:
            parser.error("--max-turns must be >= 1")
        from skyrl_tool_agent.env.environment import DEFAULT_MAX_TURNS

        with cli_main_guard(also=(FileNotFoundError, ValueError)):
            summary = export_skyrl_parquet(Path(out_dir).expanduser(), args.spider_root,
                                           args.max_turns or DEFAULT_MAX_TURNS)
        print(json.dumps(summary, indent=1))
        return 0
    if args.max_turns is not None:
        parser.error("--max-turns goes with --export")

    from skyrl_tool_agent.data.builtin import build_builtin
    from skyrl_tool_agent.data.builtin.location import default_output_dir
    from skyrl_tool_agent.data.spider import load_spider

    seed = 0 if args.seed is None else args.seed
    out = Path(args.output_dir).expanduser() if args.output_dir else default_output_dir(seed)
    report = build_builtin(out, seed=seed)
    print(json.dumps(report.summary(), indent=1))
    if args.spider_root is not None:
        for split in ("dev", "train"):
            result = load_spider(args.spider_root, split)  # type: ignore[arg-type]
            levels = Counter(t.spider_hardness for t in result.tasks)
            print(f"spider {split}: {len(result.tasks)} loaded, {result.skipped} skipped "
                  f"{result.skipped_db_ids}, hardness {dict(sorted(levels.items()))}")
    return 0
