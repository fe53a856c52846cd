"""`GoldResultCache`: gold query results kept between the episodes of a task (a bounded LRU)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp_tools.sandbox import QueryResult
from skyrl_tool_agent.config.base import default_of
from skyrl_tool_agent.config.env import RewardConfig
from skyrl_tool_agent.rewards.limits import database_identity


class GoldResultCache:
    """Bounded, thread-safe LRU of gold query results keyed by (database path, gold SQL)."""

    def __init__(self, maxsize: int = default_of(RewardConfig, "gold_cache_size")) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._data: OrderedDict[tuple[str, str, Any], QueryResult] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _key(db_path: str | Path, sql: str, identity: Any = None) -> tuple[str, str, Any]:
        # The file's identity is part of the key: a database replaced or rewritten mid-run must
        # not be compared against results of the old file.
        return (str(Path(db_path).resolve()), sql, identity if identity is not None else database_identity(db_path))

    def get(self, db_path: str | Path, sql: str, *, identity: Any = None) -> QueryResult | None:
        """The cached result (counted as a hit) or None (counted as a miss). `identity`: the
        database file's `limits.database_identity` if the caller already has it (else stat'ed)."""
        key = self._key(db_path, sql, identity)
        with self._lock:
            result = self._data.get(key)
            if result is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return result

    def put(self, db_path: str | Path, sql: str, result: QueryResult, *, identity: Any = None) -> None:
        """Store a result, evicting the least recently used entry beyond ``maxsize``."""
        key = self._key(db_path, sql, identity)
        with self._lock:
            self._data[key] = result
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def get_or_run(
        self, db_path: str | Path, sql: str, run: Callable[[], QueryResult], *, identity: Any = None
    ) -> QueryResult:
        """Cached result, else ``run()`` (outside the lock: two threads may both run it) and store."""
        result = self.get(db_path, sql, identity=identity)
        if result is None:
            result = run()
            self.put(db_path, sql, result, identity=identity)
        return result

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)


__all__ = ["GoldResultCache"]
