"""Build the built-in text-to-SQL dataset: SQLite files + train/dev task files, deterministically."""

from __future__ import annotations

import logging
import random
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from skyrl_tool_agent.data.builtin.schema import (Domain, Template, create_database, has_answer, limit_is_ambiguous,
                                                 slot_candidates)
from skyrl_tool_agent.data.hardness import spider_hardness, to_difficulty
from skyrl_tool_agent.data.tasks import Task, db_path_for, save_tasks

logger = logging.getLogger(__name__)

# Instances per template and split. Dev reuses the templates with held-out slot values.
TRAIN_PER_TEMPLATE = 9
DEV_PER_TEMPLATE = 2
# Results longer than this are dropped: a tool result must fit a small model's context.
MAX_RESULT_ROWS = 40


@dataclass
class Instance:
    """One filled template, before ids and splits are assigned."""

    template_id: str
    db_id: str
    question: str
    gold_sql: str

    def task(self, task_id: str, split: str, difficulty: str) -> Task:
        """This instance as a built-in task of `split`."""
        return Task(task_id=task_id, db_id=self.db_id, question=self.question, gold_sql=self.gold_sql,
                    difficulty=difficulty, source="builtin", split=split, template_id=self.template_id)


@dataclass
class BuildReport:
    """What `build_builtin` wrote."""

    out_dir: Path
    db_rows: dict[str, dict[str, int]]
    train: list[Task]
    dev: list[Task]
    dropped: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def summary(self) -> dict[str, object]:
        def by_difficulty(tasks: list[Task]) -> dict[str, int]:
            return dict(sorted(Counter(t.difficulty for t in tasks).items()))

        size = sum(p.stat().st_size for p in self.out_dir.rglob("*") if p.is_file())
        return {
            "databases": len(self.db_rows),
            "templates": len({t.template_id for t in self.train + self.dev}),
            "train": len(self.train),
            "dev": len(self.dev),
            "train_difficulty": by_difficulty(self.train),
            "dev_difficulty": by_difficulty(self.dev),
            "dropped_candidates": dict(self.dropped),
            "bytes_on_disk": size,
            "seconds": round(self.seconds, 2),
        }


def template_instances(domain: Domain, template: Template, con: sqlite3.Connection,
               dropped: Counter[str]) -> list[list[Instance]]:
    """All usable instances of a template, one list (of paraphrases) per slot assignment."""
    template_id = f"{domain.db_id}.{template.local_id}"
    groups = []
    for slots in slot_candidates(template, con):
        sql = template.sql.format(**slots)
        rows = con.execute(sql).fetchall()
        if not has_answer(rows):
            dropped["empty"] += 1
            continue
        if len(rows) > MAX_RESULT_ROWS:
            dropped["too_many_rows"] += 1
            continue
        if limit_is_ambiguous(con, sql):
            dropped["limit_tie"] += 1
            continue
        questions = [q.format(**slots) for q in template.questions]
        groups.append([Instance(template_id, domain.db_id, q, sql) for q in questions])
    return groups


def split_template(groups: list[list[Instance]], rng: random.Random, train_n: int, dev_n: int,
                   ) -> tuple[list[Instance], list[Instance]]:
    """Train/dev instances of one template.

    A template without slots (one group) puts every paraphrase in train. Otherwise slot
    assignments are shuffled, the first ones go to dev (at most a quarter of them) and the next
    ones to train, each with one randomly chosen paraphrase: dev questions use held-out values.
    """
    if len(groups) == 1:
        return list(groups[0]), []
    order = list(groups)
    rng.shuffle(order)
    n_dev = min(dev_n, len(order) // 4)
    chosen = [rng.choice(group) for group in order[: n_dev + train_n]]
    return chosen[n_dev:], chosen[:n_dev]


def _to_tasks(instances: list[Instance], split: str) -> list[Task]:
    return [inst.task(f"builtin-{split}-{i:05d}", split, to_difficulty(spider_hardness(inst.gold_sql)))
            for i, inst in enumerate(instances)]


def _check_questions(train: list[Instance], dev: list[Instance]) -> None:
    """Each question maps to one SQL, and no question string is in both splits."""
    sql_of: dict[str, str] = {}
    for inst in train + dev:
        if sql_of.setdefault(inst.question, inst.gold_sql) != inst.gold_sql:
            raise ValueError(f"question {inst.question!r} has two gold queries")
    overlap = {i.question for i in train} & {i.question for i in dev}
    if overlap:
        raise ValueError(f"{len(overlap)} questions in both train and dev, e.g. {sorted(overlap)[0]!r}")


def build_builtin(out_dir: str | Path = "data/processed", seed: int = 0) -> BuildReport:
    """Write `<out_dir>/databases/<db_id>/<db_id>.sqlite`, `train.json` and `dev.json`.

    Same seed, same output bytes. Raises ValueError if a template is malformed, a question maps to
    two queries, or a question lands in both splits.
    """
    from skyrl_tool_agent.data.builtin.domains import DOMAINS  # late: the domain modules are large

    started = time.perf_counter()
    out = Path(out_dir)
    db_rows: dict[str, dict[str, int]] = {}
    train: list[Instance] = []
    dev: list[Instance] = []
    dropped: Counter[str] = Counter()
    for domain in DOMAINS:
        path = db_path_for(out / "databases", domain.db_id)
        db_rows[domain.db_id] = create_database(domain, path, seed)
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            for template in domain.templates:
                template.check()
                rng = random.Random(f"{seed}:{domain.db_id}.{template.local_id}")
                groups = template_instances(domain, template, con, dropped)
                if not groups:  # e.g. every candidate was a LIMIT tie for this seed
                    logger.warning("%s.%s: no usable instance", domain.db_id, template.local_id)
                    dropped["template_unused"] += 1
                    continue
                t, d = split_template(groups, rng, TRAIN_PER_TEMPLATE, DEV_PER_TEMPLATE)
                train += t
                dev += d
        finally:
            con.close()
    _check_questions(train, dev)
    report = BuildReport(out, db_rows, _to_tasks(train, "train"), _to_tasks(dev, "dev"), dropped)
    save_tasks(report.train, out / "train.json")
    save_tasks(report.dev, out / "dev.json")
    report.seconds = time.perf_counter() - started
    logger.info("built-in dataset: %s", report.summary())
    return report


__all__ = ["BuildReport", "Instance", "build_builtin", "split_template", "template_instances"]
