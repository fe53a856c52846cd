"""Built-in text-to-SQL dataset: seeded SQLite databases of several domains + templated questions.

`build_builtin(out_dir, seed)` writes `databases/<db_id>/<db_id>.sqlite`, `train.json` and
`dev.json`; see data/processed/README.md for the format and how difficulty is assigned.
"""

from __future__ import annotations

from skyrl_tool_agent.data.builtin.generate import BuildReport, build_builtin

__all__ = ["BuildReport", "build_builtin"]
