"""Spider hardness (easy / medium / hard / extra), as the official Spider evaluation computes it.

The official `evaluation.py` (taoyds/spider) classifies a query by three counts over the SQL dict that
its own parser (`process_sql.py`) builds against the database schema:

* component1: WHERE, GROUP BY, ORDER BY, LIMIT, each join beyond the first table, each OR and each LIKE
  among the FROM/WHERE/HAVING conditions;
* component2: nested queries in conditions plus an INTERSECT / UNION / EXCEPT;
* others: more than one aggregate, more than one SELECT column, more than one WHERE condition, more
  than one GROUP BY column.

`eval_hardness` below is a line-for-line port of that counting over the Spider SQL dict (the `sql`
field of Spider's dev.json / train_spider.json), kept faithful including its quirks:
`count_agg` over WHERE/HAVING condition units tests `cond_unit[0]`, which is the NOT flag, and over
HAVING it also counts the 'and'/'or' connector strings.

`spider_sql_from_sqlglot` rebuilds that dict from a sqlglot parse, so any query (e.g. Spider training
questions that ship without the parsed `sql`, or our built-in gold SQL) can be classified without the
Spider schema. Approximations, since sqlglot is not the Spider parser:

* column/table ids are placeholders (hardness never looks at them);
* sqlglot's operator precedence is flattened back to Spider's left-to-right condition list; parenthesised
  AND/OR groups are flattened too;
* for `A UNION B INTERSECT C` only the leftmost SELECT and "one set operation" are counted, like Spider;
  ORDER BY / LIMIT that sqlglot attaches to the set operation belong to the last SELECT in Spider and
  are ignored for the top-level counts;
* a SELECT item's aggregate is the aggregate of its leftmost operand (Spider reads `max(a) - min(a)` as
  a `max` item).

On Spider dev this agrees with the official hardness on all 1,034 questions (sqlglot 30.30; the test in
tests/test_spider.py requires >= 98 % agreement so a sqlglot upgrade has some slack).
"""

from __future__ import annotations

import logging
from typing import Any

import sqlglot
from sqlglot import exp

from skyrl_tool_agent.data.tasks import Difficulty, SpiderHardness

logger = logging.getLogger(__name__)

# Same tuples as Spider's process_sql.py; the counting below indexes into them.
AGG_OPS = ("none", "max", "min", "count", "sum", "avg")
WHERE_OPS = ("not", "between", "=", ">", "<", ">=", "<=", "!=", "in", "like", "is", "exists")
UNIT_OPS = ("none", "-", "+", "*", "/")

SpiderSql = dict[str, Any]

# ----------------------------------------------------------------------------------------------------
# Official counting (port of evaluation.py: has_agg .. eval_hardness)
# ----------------------------------------------------------------------------------------------------


def _has_agg(unit: Any) -> bool:
    return unit[0] != AGG_OPS.index("none")


def _count_agg(units: list[Any]) -> int:
    return len([unit for unit in units if _has_agg(unit)])


def _nested_sql(sql: SpiderSql) -> list[SpiderSql]:
    nested = []
    for cond_unit in sql["from"]["conds"][::2] + sql["where"][::2] + sql["having"][::2]:
        if isinstance(cond_unit[3], dict):
            nested.append(cond_unit[3])
        if isinstance(cond_unit[4], dict):
            nested.append(cond_unit[4])
    for key in ("intersect", "except", "union"):
        if sql[key] is not None:
            nested.append(sql[key])
    return nested


def count_component1(sql: SpiderSql) -> int:
    """Official component1 count (WHERE, GROUP BY, ORDER BY, LIMIT, joins, OR, LIKE)."""
    count = 0
    if len(sql["where"]) > 0:
        count += 1
    if len(sql["groupBy"]) > 0:
        count += 1
    if len(sql["orderBy"]) > 0:
        count += 1
    if sql["limit"] is not None:
        count += 1
    if len(sql["from"]["table_units"]) > 0:
        count += len(sql["from"]["table_units"]) - 1
    connectors = sql["from"]["conds"][1::2] + sql["where"][1::2] + sql["having"][1::2]
    count += len([tok for tok in connectors if tok == "or"])
    cond_units = sql["from"]["conds"][::2] + sql["where"][::2] + sql["having"][::2]
    count += len([cu for cu in cond_units if cu[1] == WHERE_OPS.index("like")])
    return count


def count_component2(sql: SpiderSql) -> int:
    """Official component2 count (nested queries in conditions + one set operation)."""
    return len(_nested_sql(sql))


def count_others(sql: SpiderSql) -> int:
    """Official 'others' count (several aggregates / SELECT columns / WHERE conditions / GROUP BY columns)."""
    count = 0
    agg_count = _count_agg(sql["select"][1])
    agg_count += _count_agg(sql["where"][::2])
    agg_count += _count_agg(sql["groupBy"])
    if len(sql["orderBy"]) > 0:
        agg_count += _count_agg(
            [unit[1] for unit in sql["orderBy"][1] if unit[1]]
            + [unit[2] for unit in sql["orderBy"][1] if unit[2]]
        )
    agg_count += _count_agg(sql["having"])
    if agg_count > 1:
        count += 1
    if len(sql["select"][1]) > 1:
        count += 1
    if len(sql["where"]) > 1:
        count += 1
    if len(sql["groupBy"]) > 1:
        count += 1
    return count


def eval_hardness(sql: SpiderSql) -> SpiderHardness:
    """Official Spider hardness of a Spider SQL dict (the `sql` field of Spider's JSON files)."""
    c1 = count_component1(sql)
    c2 = count_component2(sql)
    others = count_others(sql)
    if c1 <= 1 and others == 0 and c2 == 0:
        return "easy"
    if (others <= 2 and c1 <= 1 and c2 == 0) or (c1 <= 2 and others < 2 and c2 == 0):
        return "medium"
    if (
        (others > 2 and c1 <= 2 and c2 == 0)
        or (2 < c1 <= 3 and others <= 2 and c2 == 0)
        or (c1 <= 1 and others == 0 and c2 <= 1)
    ):
        return "hard"
    return "extra"


# ----------------------------------------------------------------------------------------------------
# sqlglot -> Spider SQL dict
# ----------------------------------------------------------------------------------------------------

_AGG_TYPES: dict[type[exp.Expression], int] = {
    exp.Max: AGG_OPS.index("max"),
    exp.Min: AGG_OPS.index("min"),
    exp.Count: AGG_OPS.index("count"),
    exp.Sum: AGG_OPS.index("sum"),
    exp.Avg: AGG_OPS.index("avg"),
}
_UNIT_TYPES: dict[type[exp.Expression], int] = {
    exp.Sub: UNIT_OPS.index("-"),
    exp.Add: UNIT_OPS.index("+"),
    exp.Mul: UNIT_OPS.index("*"),
    exp.Div: UNIT_OPS.index("/"),
}
_CMP_TYPES: dict[type[exp.Expression], int] = {
    exp.EQ: WHERE_OPS.index("="),
    exp.GT: WHERE_OPS.index(">"),
    exp.LT: WHERE_OPS.index("<"),
    exp.GTE: WHERE_OPS.index(">="),
    exp.LTE: WHERE_OPS.index("<="),
    exp.NEQ: WHERE_OPS.index("!="),
    exp.Like: WHERE_OPS.index("like"),
    exp.ILike: WHERE_OPS.index("like"),
    exp.Is: WHERE_OPS.index("is"),
}


def _unparen(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _agg_id(node: exp.Expression | None) -> int:
    if node is None:
        return 0
    node = _unparen(node)
    for agg_type, agg_id in _AGG_TYPES.items():
        if isinstance(node, agg_type):
            return agg_id
    return 0


def _col_unit(node: exp.Expression) -> tuple[int, int, bool]:
    node = _unparen(node)
    agg = _agg_id(node)
    distinct = agg != 0 and isinstance(node.this, exp.Distinct)
    return (agg, 0, distinct)


def _val_unit(node: exp.Expression) -> tuple[int, Any, Any]:
    node = _unparen(node)
    for unit_type, unit_id in _UNIT_TYPES.items():
        if isinstance(node, unit_type):
            return (unit_id, _col_unit(node.this), _col_unit(node.expression))
    return (0, _col_unit(node), None)


def _leftmost(node: exp.Expression) -> exp.Expression:
    node = _unparen(node)
    while isinstance(node, tuple(_UNIT_TYPES)):
        node = _unparen(node.this)
    return node


def _value(node: exp.Expression | None) -> Any:
    """A condition value: a Spider SQL dict for a subquery, else an opaque placeholder."""
    if node is None:
        return None
    node = _unparen(node)
    if isinstance(node, exp.Subquery):
        node = node.this
    if isinstance(node, exp.Query):
        return _query_to_spider(node)
    return node.sql(dialect="sqlite")


def _cond_unit(node: exp.Expression) -> tuple[bool, int, Any, Any, Any]:
    not_op = False
    node = _unparen(node)
    while isinstance(node, exp.Not):
        not_op = not not_op
        node = _unparen(node.this)
    if node.args.get("negate"):  # sqlglot >= 26 folds NOT LIKE / NOT BETWEEN into a flag
        not_op = not not_op
    if isinstance(node, exp.Between):
        return (not_op, WHERE_OPS.index("between"), _val_unit(node.this),
                _value(node.args.get("low")), _value(node.args.get("high")))
    if isinstance(node, exp.In):
        query = node.args.get("query")
        val = _value(query) if query is not None else "(list)"
        return (not_op, WHERE_OPS.index("in"), _val_unit(node.this), val, None)
    if isinstance(node, exp.Exists):
        return (not_op, WHERE_OPS.index("exists"), (0, (0, 0, False), None), _value(node.this), None)
    for cmp_type, op_id in _CMP_TYPES.items():
        if isinstance(node, cmp_type):
            return (not_op, op_id, _val_unit(node.this), _value(node.expression), None)
    # A bare expression used as a condition (rare): treat it as `expr = true`.
    return (not_op, WHERE_OPS.index("="), _val_unit(node), None, None)


def _conditions(node: exp.Expression | None) -> list[Any]:
    """Spider's flat condition list [cond, 'and'|'or', cond, ...], read left to right."""
    if node is None:
        return []
    inner = _unparen(node)
    if isinstance(inner, exp.And):
        return _conditions(inner.this) + ["and"] + _conditions(inner.expression)
    if isinstance(inner, exp.Or):
        return _conditions(inner.this) + ["or"] + _conditions(inner.expression)
    return [_cond_unit(inner)]


def _table_unit(node: exp.Expression) -> tuple[str, Any]:
    node = _unparen(node)
    if isinstance(node, exp.Subquery):
        return ("sql", _query_to_spider(node.this))
    return ("table_unit", 0)


def _empty_sql() -> SpiderSql:
    return {
        "select": (False, []),
        "from": {"table_units": [], "conds": []},
        "where": [],
        "groupBy": [],
        "having": [],
        "orderBy": [],
        "limit": None,
        "intersect": None,
        "union": None,
        "except": None,
    }


def _select_to_spider(select: exp.Select) -> SpiderSql:
    sql = _empty_sql()
    units = []
    for item in select.expressions:
        item = item.this if isinstance(item, exp.Alias) else item
        units.append((_agg_id(_leftmost(item)), _val_unit(item)))
    sql["select"] = (bool(select.args.get("distinct")), units)

    from_ = select.args.get("from_") or select.args.get("from")
    table_units, conds = [], []
    if from_ is not None:
        table_units.append(_table_unit(from_.this))
    for join in select.args.get("joins") or []:
        table_units.append(_table_unit(join.this))
        join_conds = _conditions(join.args.get("on"))
        if join_conds:
            if conds:
                conds.append("and")
            conds.extend(join_conds)
    sql["from"] = {"table_units": table_units, "conds": conds}

    where = select.args.get("where")
    sql["where"] = _conditions(where.this) if where is not None else []
    group = select.args.get("group")
    sql["groupBy"] = [_col_unit(g) for g in group.expressions] if group is not None else []
    having = select.args.get("having")
    sql["having"] = _conditions(having.this) if having is not None else []
    order = select.args.get("order")
    if order is not None and order.expressions:
        direction = "desc" if order.expressions[0].args.get("desc") else "asc"
        sql["orderBy"] = (direction, [_val_unit(o.this) for o in order.expressions])
    limit = select.args.get("limit")
    if limit is not None:
        sql["limit"] = limit.expression.sql() if limit.expression is not None else "?"
    return sql


_SET_KEYS: dict[type[exp.Expression], str] = {
    exp.Intersect: "intersect",
    exp.Union: "union",
    exp.Except: "except",
}


def _flatten_set_ops(node: exp.Expression) -> list[Any]:
    """[select, op, select, op, ...] in source order, whatever sqlglot's precedence nesting."""
    node = _unparen(node)
    if isinstance(node, exp.Subquery):
        return _flatten_set_ops(node.this)
    if isinstance(node, exp.SetOperation):
        key = next(k for t, k in _SET_KEYS.items() if isinstance(node, t))
        return _flatten_set_ops(node.this) + [key] + _flatten_set_ops(node.expression)
    return [node]


def _query_to_spider(node: exp.Expression) -> SpiderSql:
    parts = _flatten_set_ops(node)
    # Spider nests set operations to the right: A.union = (B.intersect = C).
    sql = None
    for i in range(len(parts) - 1, -1, -2):
        part = parts[i]
        current = _select_to_spider(part) if isinstance(part, exp.Select) else _empty_sql()
        if sql is not None:
            current[parts[i + 1]] = sql
        sql = current
    assert sql is not None
    return sql


def spider_sql_from_sqlglot(query: str) -> SpiderSql:
    """Parse `query` (SQLite dialect) with sqlglot into a Spider-style SQL dict.

    Raises `sqlglot.errors.ParseError` when sqlglot cannot parse the query.
    """
    tree = sqlglot.parse_one(query, read="sqlite")
    return _query_to_spider(tree)


def spider_hardness(query: str) -> SpiderHardness:
    """Official Spider hardness of a SQL string, via sqlglot (see module docstring for approximations).

    A query sqlglot cannot parse is logged and rated 'extra' (the hardest bucket).
    """
    try:
        sql = spider_sql_from_sqlglot(query)
    except sqlglot.errors.SqlglotError as exc:
        logger.warning("cannot parse SQL for hardness, rating it 'extra': %s (%s)", query, exc)
        return "extra"
    return eval_hardness(sql)


def to_difficulty(hardness: SpiderHardness) -> Difficulty:
    """Map the four Spider levels onto the three curriculum buckets ('extra' -> 'hard')."""
    return "hard" if hardness == "extra" else hardness
