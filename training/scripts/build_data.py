#!/usr/bin/env python
"""Build the built-in text-to-SQL dataset (SQLite databases + train.json / dev.json).

    python training/scripts/build_data.py [--out data/processed] [--seed 0]

Deterministic: the same seed rewrites byte-identical files. Optionally also reports the Spider
figures (`--spider-root ../shared/spider`), which are read in place, never copied.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

from skyrl_tool_agent.data.builtin import build_builtin  # noqa: E402
from skyrl_tool_agent.data.spider import load_spider  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "data" / "processed", help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    parser.add_argument("--spider-root", type=Path, default=None,
                        help="also summarise Spider dev/train found here (e.g. ../shared/spider)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    report = build_builtin(args.out, seed=args.seed)
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
