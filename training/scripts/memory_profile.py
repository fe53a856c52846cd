#!/usr/bin/env python
"""Alias of `skyrl-tool-agent memory-profile` (same flags): peak memory of one GRPO update per training mode.

Kept so that `python training/scripts/memory_profile.py` works from a checkout without an install; the
command is skyrl_tool_agent/commands/memory_profile.py (`--help` lists the flags), its job jobs/memory_profile.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without install

from skyrl_tool_agent.commands.memory_profile import main, parse_args  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
