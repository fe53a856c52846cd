#!/usr/bin/env python
"""Alias of `skyrl-tool-agent build-model` (same flags): build the embedded default model.

Kept so that `python training/scripts/build_default_model.py` works from a checkout without an install; the
implementation is skyrl_tool_agent/commands/build_model.py (`--help` lists the flags).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without install

from skyrl_tool_agent.commands.build_model import build_parser, main  # noqa: E402,F401

if __name__ == "__main__":
    main()
