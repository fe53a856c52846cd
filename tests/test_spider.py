"""Spider importer and the official hardness rules (Spider-dependent tests skip when it is absent)."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from skyrl_tool_agent.data.hardness import (
    eval_hardness,
    spider_hardness,
    spider_sql_from_sqlglot,
    to_difficulty,
)
from skyrl_tool_agent.data.spider import load_spider, read_json_tolerant

# Published distribution of the official evaluation over Spider dev (1,034 questions).
OFFICIAL_DEV = {"easy": 248, "medium": 446, "hard": 174, "extra": 166}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SELECT count(*) FROM singer", "easy"),
        ("SELECT name FROM singer WHERE age > 30", "easy"),
        ("SELECT name, country FROM singer ORDER BY age DESC", "medium"),  # 2 columns + ORDER BY
        ("SELECT T2.name FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = T2.stadium_id WHERE T1.year = 2014",
         "medium"),  # join + WHERE
        ("SELECT name FROM singer WHERE age > 30 AND country = 'France' ORDER BY age LIMIT 1", "hard"),
        ("SELECT name FROM stadium WHERE stadium_id NOT IN (SELECT stadium_id FROM concert)", "hard"),
        ("SELECT country FROM singer WHERE age > 40 INTERSECT SELECT country FROM singer WHERE age < 30", "hard"),
        ("SELECT country FROM singer WHERE age > 40 AND is_male = 'F' INTERSECT SELECT country FROM singer", "extra"),
        ("SELECT T2.name FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = T2.stadium_id "
         "GROUP BY T1.stadium_id ORDER BY count(*) DESC LIMIT 1", "extra"),
        ("SELECT name FROM singer WHERE name LIKE '%Hey%' OR country = 'USA'", "hard"),  # WHERE + LIKE + OR = 3
    ],
)
def test_hardness_of_hand_checked_queries(query: str, expected: str) -> None:
    assert spider_hardness(query) == expected


def test_parsed_dict_has_spider_shape() -> None:
    sql = spider_sql_from_sqlglot(
        "SELECT a FROM t AS T1 JOIN u AS T2 ON T1.id = T2.id WHERE x = 1 OR y IN (SELECT y FROM v) "
        "UNION SELECT a FROM w"
    )
    assert len(sql["from"]["table_units"]) == 2
    assert sql["where"][1] == "or" and isinstance(sql["where"][2][3], dict)  # nested query as value
    assert sql["union"] is not None and sql["intersect"] is None


def test_unparsable_sql_is_rated_extra(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert spider_hardness("SELECT FROM WHERE (((") == "extra"
    assert "cannot parse" in caplog.text


def test_extra_maps_to_hard() -> None:
    assert [to_difficulty(h) for h in ("easy", "medium", "hard", "extra")] == ["easy", "medium", "hard", "hard"]


@pytest.mark.spider
def test_dev_loads_972_and_skips_wta_1(spider_root: Path) -> None:
    result = load_spider(spider_root, "dev")
    assert len(result.tasks) + result.skipped == 1034
    assert result.skipped == 62 and result.skipped_db_ids == {"wta_1": 62}
    assert len(result.tasks) == 972
    assert len({t.task_id for t in result.tasks}) == 972
    assert {t.source for t in result.tasks} == {"spider"} and {t.split for t in result.tasks} == {"dev"}
    assert all(t.difficulty == to_difficulty(t.spider_hardness) for t in result.tasks)  # type: ignore[arg-type]
    first = result.tasks[0]
    assert (first.task_id, first.db_id, first.gold_sql) == ("spider-dev-0000", "concert_singer", "SELECT count(*) FROM singer")
    assert (spider_root / "database" / first.db_id / f"{first.db_id}.sqlite").is_file()


@pytest.mark.spider
def test_hardness_matches_official_distribution_on_dev(spider_root: Path) -> None:
    records = json.loads((spider_root / "dev.json").read_text(encoding="utf-8"))
    official = [eval_hardness(r["sql"]) for r in records]  # official counting over Spider's own parse
    ours = [spider_hardness(r["query"]) for r in records]  # same counting over a sqlglot parse
    assert Counter(official) == OFFICIAL_DEV
    agreement = sum(a == b for a, b in zip(official, ours)) / len(records)
    assert agreement >= 0.98, agreement
    for level, count in OFFICIAL_DEV.items():
        assert abs(Counter(ours)[level] - count) <= 0.02 * len(records), (level, Counter(ours))


@pytest.mark.spider
def test_train_uses_sqlglot_hardness_and_skips_missing_dbs(spider_root: Path) -> None:
    result = load_spider(spider_root, "train")
    assert len(result.tasks) + result.skipped == 7000
    assert result.skipped_db_ids == {"baseball_1": 82, "soccer_1": 14}
    assert {t.spider_hardness for t in result.tasks} == {"easy", "medium", "hard", "extra"}


def _fake_spider(root: Path, questions: bytes) -> None:
    (root / "database" / "shop").mkdir(parents=True)
    sqlite3.connect(root / "database" / "shop" / "shop.sqlite").close()
    (root / "dev.json").write_bytes(questions)


def test_invalid_utf8_is_replaced_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # 0xff can never start a UTF-8 sequence; Spider's text holds bytes like it
    raw = b'[{"db_id": "shop", "question": "Caf\xff prices?", "query": "SELECT price FROM item"}]'
    _fake_spider(tmp_path, raw)
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")
    with caplog.at_level(logging.WARNING):
        result = load_spider(tmp_path, "dev")
    assert [t.question for t in result.tasks] == ["Caf\ufffd prices?"]
    assert "not valid UTF-8" in caplog.text
    assert read_json_tolerant(tmp_path / "dev.json")[0]["db_id"] == "shop"


def test_missing_database_is_skipped_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    records = [
        {"db_id": "shop", "question": "How many items?", "query": "SELECT count(*) FROM item"},
        {"db_id": "gone", "question": "How many rows?", "query": "SELECT count(*) FROM x"},
        {"db_id": "gone", "question": "Any rows?", "query": "SELECT * FROM x"},
    ]
    _fake_spider(tmp_path, json.dumps(records).encode())
    with caplog.at_level(logging.WARNING):
        result = load_spider(tmp_path, "dev")
    assert [t.task_id for t in result.tasks] == ["spider-dev-0000"]
    assert result.tasks[0].spider_hardness == "easy"  # no parsed 'sql' field: rated via sqlglot
    assert (result.skipped, result.skipped_db_ids) == (2, {"gone": 2})
    assert "skipped 2" in caplog.text


def test_missing_split_file_names_the_paths(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="train_spider_compact.json"):
        load_spider(tmp_path, "train")
