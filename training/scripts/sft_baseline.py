#!/usr/bin/env python
"""Alias of `skyrl-tool-agent sft-baseline` (same flags): continue the warm start for a wall time (GRPO's baseline).

Kept so that `python training/scripts/sft_baseline.py` works from a checkout without an install; the
implementation is skyrl_tool_agent/commands/sft_baseline.py (`--help` lists the flags).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without install

from skyrl_tool_agent.commands.sft_baseline import main, parse_args  # noqa: E402,F401

if __name__ == "__main__":
    main()
