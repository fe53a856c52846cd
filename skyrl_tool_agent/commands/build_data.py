"""Build the built-in text-to-SQL dataset (SQLite databases + train.json / dev.json).

    skyrl-tool-agent build-data [--output-dir DIR] [--seed 0]
    python training/scripts/build_data.py ...          # the same command

DIR defaults to where the built-in data is read from: a source checkout's data/processed, else the
cache entry ($SKYRL_TOOL_AGENT_CACHE or ~/.cache/skyrl_tool_agent, builtin/...) that training and
evaluation would otherwise build on first use. Deterministic: the same seed rewrites byte-identical
files. Optionally also reports the Spider figures (`--spider-root ../shared/spider`), which are
read in place, never copied.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from pathlib import Path

from skyrl_tool_agent.commands._args import add_output_dir, new_parser


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from skyrl_tool_agent.data.builtin.location import default_output_dir

    parser = new_parser(__doc__, prog)
    add_output_dir(parser, f"output folder (default {default_output_dir()})",
                   legacy=("--out",))
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    parser.add_argument("--spider-root", type=Path, default=None,
                        help="also summarise Spider dev/train found here (e.g. ../shared/spider)")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    from skyrl_tool_agent.data.builtin import build_builtin
    from skyrl_tool_agent.data.builtin.location import default_output_dir
    from skyrl_tool_agent.data.spider import load_spider

    out = Path(args.output_dir).expanduser() if args.output_dir else default_output_dir(args.seed)
    report = build_builtin(out, seed=args.seed)
    print(json.dumps(report.summary(), indent=1))
    if args.spider_root is not None:
        for split in ("dev", "train"):
            result = load_spider(args.spider_root, split)  # type: ignore[arg-type]
            levels = Counter(t.spider_hardness for t in result.tasks)
            print(f"spider {split}: {len(result.tasks)} loaded, {result.skipped} skipped "
                  f"{result.skipped_db_ids}, hardness {dict(sorted(levels.items()))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
