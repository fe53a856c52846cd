#!/usr/bin/env python
"""Alias of `skyrl-tool-agent build-data` (same flags): build the built-in text-to-SQL dataset.

Kept so that `python training/scripts/build_data.py` works from a checkout without an install; the
implementation is skyrl_tool_agent/commands/build_data.py (`--help` lists the flags).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without install

from skyrl_tool_agent.commands.build_data import build_parser, main  # noqa: E402,F401

if __name__ == "__main__":
    raise SystemExit(main())
