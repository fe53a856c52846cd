"""The built-in data's test split: in-family tasks that nothing trains on, tunes on or reports
besides it (issue 58).

The generated pool already holds every slot assignment of every template on the built-in
databases (`pool`): the shipped start was trained on all of it but the validation split, and the
validation split chose the training pool, so none of it is a clean test. The test split is
generated anew instead: the same templates on databases built by the same generator with another
seed (`TEST_DB_SEED`: other rows, hence other constants and other answers, the same schemas and
db_ids), one paraphrase each of `n` gold queries chosen by a hash in the "test" namespace, spread
over the templates. Every
slot assignment whose gold query or any of whose questions a known task has (train, pool,
validation, dev: `exclude`) is left out, so no test question or gold query is one a model was
trained, tuned or stopped on. Its databases live apart (`test_db_root`), built on first use.

A template can be tested only where the other rows give it new questions: 98 of the 273 templates
(97 of dev's 183) have such queries (3,590 of them); the others' questions are all known (no slots,
or slot values from word lists every seed shares), so the test split speaks for those 98.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from skyrl_tool_agent.config.builtin_paths import DB_DIR, cache_root, generator_digest
from skyrl_tool_agent.data.builtin.location import build_into
from skyrl_tool_agent.data.builtin.pool import template_difficulty, template_groups
from skyrl_tool_agent.data.builtin.schema import create_database
from skyrl_tool_agent.data.tasks import Task, db_path_for

logger = logging.getLogger(__name__)

__all__ = ["TEST_DB_SEED", "generated_test_split", "test_db_root"]

#: The generator seed of the test databases (the built-in ones are seed 0).
TEST_DB_SEED = 58_001
#: The namespace of the hash that picks the test queries: fixed, so every run and seed reports the same tasks.
TEST_NAMESPACE = "test"


def test_db_root() -> Path:
    """The test databases' root (`<db_id>/<db_id>.sqlite`), built into the cache on first use (under
    a staging directory renamed into place: never half-written); keyed by the generator's digest."""
    root = cache_root() / "builtin" / f"test{TEST_DB_SEED}-{generator_digest()}"
    target = root / DB_DIR
    if target.is_dir():
        return target
    from skyrl_tool_agent.data.builtin.domains import DOMAINS  # late: the domain modules are large

    def build(staging: Path) -> None:
        for domain in DOMAINS:
            create_database(domain, db_path_for(staging, domain.db_id), TEST_DB_SEED)

    build_into(target, build, complete=Path.is_dir)
    logger.info("built the test split's databases into %s", target)
    return target


def generated_test_split(db_root: str | Path, exclude: Sequence[Task], n: int) -> list[Task]:
    """`n` test tasks (module docstring) on the databases under `db_root` (`test_db_root()`), none
    sharing a question or a gold query with `exclude`; sorted by task id (`builtin-test-NNNNN`).
    Raises FileNotFoundError when a database is missing, ValueError when `n` is more than the
    fresh queries there are."""
    groups = [group for group, fresh in template_groups(db_root, exclude, "test") if fresh]
    fresh = {g[0].gold_sql: g for g in reversed(groups)}  # one group per query: the first one enumerated
    if n > len(fresh):
        raise ValueError(f"a test split of {n} asks for more than the {len(fresh)} fresh queries")
    # Spread over the templates: each template's queries in hash order, then round by round (every
    # template's first, then every template's second, ...), so one with many assignments does not crowd out the rest.
    by_hash = sorted(fresh, key=lambda q: hashlib.sha256(f"{TEST_NAMESPACE}:{q}".encode()).hexdigest())
    rank: Counter[str] = Counter()
    rounds = []
    for position, sql in enumerate(by_hash):
        template_id = fresh[sql][0].template_id
        rounds.append((rank[template_id], position, sql))
        rank[template_id] += 1
    chosen = [sql for _, _, sql in sorted(rounds)[:n]]
    tasks = []
    for i, sql in enumerate(sorted(chosen)):
        group = fresh[sql]
        inst = group[int(hashlib.sha256(f"{TEST_NAMESPACE}:{sql}:q".encode()).hexdigest(), 16) % len(group)]
        tasks.append(inst.task(f"builtin-test-{i:05d}", "test", template_difficulty(inst)))
    return tasks
