"""The generated training pool: every slot assignment of every built-in template, minus dev's.

`train.json` keeps 9 slot assignments per template (one paraphrase each) so the warm start has a
small fixed set; a policy warm-started on it solves most of those tasks from memory, so GRPO on the
same tasks gets almost no learning signal (all-correct groups). The pool holds the ~10.9k other
questions the same templates produce on the same databases (all paraphrases, train's assignments
included), with every assignment whose gold query is in dev left out, so RL steps mostly see
questions the policy has never trained on, drawn from dev's distribution but never dev itself.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from skyrl_tool_agent.data.builtin.generate import Instance, template_instances
from skyrl_tool_agent.data.databases import file_state
from skyrl_tool_agent.data.hardness import spider_hardness, to_difficulty
from skyrl_tool_agent.data.tasks import Task, db_path_for

logger = logging.getLogger(__name__)


#: A template's difficulty by its id (`template_difficulty`).
_TEMPLATE_DIFFICULTY: dict[str, str] = {}
#: Pools built in this process, by their databases' identity and what was held out
#: (`generated_train_pool`).
_POOLS: dict[tuple, list[Task]] = {}


def template_difficulty(instance: Instance) -> str:
    """Spider's difficulty of a built-in template's instance: its template's, parsed from the first
    instance seen. Slots are filled with values, which Spider's hardness does not count (it counts
    clauses, joins, conditions and nesting), so one sqlglot parse a template (273) serves the pool's
    ~5,400 queries, each of a ~10,900-question pool's loads (5 s of CPU a process before; every
    template's instances agree: tests/test_builtin_pool.py)."""
    if instance.template_id not in _TEMPLATE_DIFFICULTY:
        _TEMPLATE_DIFFICULTY[instance.template_id] = to_difficulty(spider_hardness(instance.gold_sql))
    return _TEMPLATE_DIFFICULTY[instance.template_id]


def template_groups(db_root: str | Path, exclude: Sequence[Task], what: str) -> Iterator[tuple[list, bool]]:
    """(group, fresh) for every slot assignment of the built-in templates on the databases under
    `db_root`, in a fixed order: its paraphrase instances, and whether none shares a gold query or a
    question with `exclude`. Raises FileNotFoundError when a database is missing (`what` names the
    kind) and ValueError when a template's query fails on it (not the databases they were made for)."""
    from skyrl_tool_agent.data.builtin.domains import DOMAINS  # late: the domain modules are large

    known_sql = {t.gold_sql for t in exclude}
    known_questions = {t.question for t in exclude}
    for domain in DOMAINS:
        path = db_path_for(db_root, domain.db_id)
        if not path.is_file():
            raise FileNotFoundError(f"{what} database not found: {path}")
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            for template in domain.templates:
                try:
                    groups = template_instances(domain, template, con, Counter())
                except sqlite3.Error as exc:
                    raise ValueError(f"{path} is not the {what} {domain.db_id} database "
                                     f"(template {template.local_id}: {exc})") from exc
                for group in groups:
                    yield group, not (group[0].gold_sql in known_sql or any(i.question in known_questions for i in group))
        finally:
            con.close()


def generated_train_pool(db_root: str | Path, held_out: Sequence[Task]) -> list[Task]:
    """Tasks for every usable slot assignment (all paraphrases) of the built-in templates on the
    databases under `db_root`, except those whose gold SQL or question is in `held_out`.

    Deterministic for given databases (templates and candidates are enumerated in a fixed order), so
    built once a process for the same database files and held-out tasks (`_pool_key`).
    Raises FileNotFoundError when a built-in database is missing and ValueError when a template's
    query fails on it (the databases are not the built-in ones).
    """
    key = _pool_key(db_root, held_out)
    if key in _POOLS:
        return list(_POOLS[key])
    tasks: list[Task] = []
    skipped = 0
    for group, fresh in template_groups(db_root, held_out, "built-in"):
        if not fresh:
            skipped += 1
            continue
        for inst in group:
            tasks.append(inst.task(f"builtin-pool-{len(tasks):05d}", "train", template_difficulty(inst)))
    logger.info("generated training pool: %d questions (%d slot assignments held out)", len(tasks), skipped)
    if key is not None:
        _POOLS[key] = tasks
    return list(tasks)


def _pool_key(db_root: str | Path, held_out: Sequence[Task]) -> tuple | None:
    """What a pool is a function of: each built-in database file as it is now (`file_state`) and
    the held-out questions and queries; None when a database is missing (the build says which). A
    pool is ~0.4 CPU-s to build and a process may ask for it more than once (the test suite's two
    workers: 31 times); Tasks are frozen, so the lists handed out share them."""
    from skyrl_tool_agent.data.builtin.domains import DOMAINS

    files = tuple(file_state(db_path_for(db_root, domain.db_id)) for domain in DOMAINS)
    if None in files:
        return None
    return files, frozenset(t.gold_sql for t in held_out), frozenset(t.question for t in held_out)


def split_validation(pool: Sequence[Task], seen: Sequence[Task], n: int, seed: int = 0) -> tuple[list[Task], list[Task]]:
    """(pool without the validation queries, validation): `n` tasks, one paraphrase each of `n`
    gold queries that no task in `seen` (the warm start's train file) has, chosen by a hash of
    (seed, query). Every paraphrase of a validation query leaves the pool, so nothing tuned or
    stopped on validation has trained on its question or its SQL. This is the yardstick for the
    warm-start curve and for tuning GRPO; dev is only ever reported."""
    import hashlib

    seen_sql = {t.gold_sql for t in seen}
    fresh = sorted({t.gold_sql for t in pool if t.gold_sql not in seen_sql},
                   key=lambda q: hashlib.sha256(f"{seed}:{q}".encode()).hexdigest())
    if n > len(fresh):
        raise ValueError(f"validation of {n} asks for more queries than the pool's {len(fresh)} unseen ones")
    chosen = set(fresh[:n])
    validation: dict[str, Task] = {}
    rest: list[Task] = []
    for task in pool:
        if task.gold_sql in chosen:
            validation.setdefault(task.gold_sql, task)  # the first paraphrase: the pool's order is fixed
        else:
            rest.append(task)
    return rest, sorted(validation.values(), key=lambda t: t.task_id)


__all__ = ["generated_train_pool", "split_validation"]
