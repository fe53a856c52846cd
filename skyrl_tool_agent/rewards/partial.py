"""Structural rewards that need no database: syntax validity, exact match, partial credit, and
the literals' match.

``partial_credit`` compares the *components* of two queries (see ``sql_components``) as sets and
averages the per-component F1 over the components that occur in either query. Components are
computed over the whole query, subqueries included, after ``sqlnorm.normalise`` and with column
qualifiers removed, so aliases, quoting, letter case, join order, ``a = b`` vs ``b = a`` and
``20 < age`` vs ``age > 20`` do not matter, while different tables, columns, predicates,
literals, grouping, ordering or limits do.
"""

from __future__ import annotations

import logging
from collections import Counter

from sqlglot import exp

from skyrl_tool_agent.rewards.sqlnorm import normalise, normalised_sql, parse_query, render

logger = logging.getLogger(__name__)

__all__ = ["COMPONENTS", "exact_match", "literal_match", "partial_credit", "sql_components", "sql_is_valid"]

#: The component names ``sql_components`` returns, in a fixed order.
COMPONENTS: tuple[str, ...] = (
    "select",
    "tables",
    "columns",
    "aggregates",
    "conditions",
    "having",
    "group_by",
    "order_by",
    "limit",
    "distinct",
    "set_ops",
)

_FLIP = {exp.GT: exp.LT, exp.LT: exp.GT, exp.GTE: exp.LTE, exp.LTE: exp.GTE}


def sql_is_valid(sql: str) -> bool:
    """True when ``sql`` parses as exactly one query (``sqlnorm.parse_query``)."""
    return parse_query(sql) is not None


def exact_match(pred_sql: str, gold_sql: str) -> bool:
    """True when both queries render identically after ``sqlnorm.normalise`` (no semantic proof)."""
    pred = normalised_sql(pred_sql)
    return pred is not None and pred == normalised_sql(gold_sql)


def _bare(node: exp.Expression) -> str:
    """Render without column qualifiers (``singer.name`` and ``name`` compare equal)."""
    node = node.copy()
    for column in node.find_all(exp.Column):
        column.set("table", None)
    if isinstance(node, exp.Alias):
        node = node.this
    return render(node)


def _conjuncts(condition: exp.Expression | None) -> list[exp.Expression]:
    """The AND-ed parts of a condition, left to right (iterative: long AND chains are deep trees)."""
    out: list[exp.Expression] = []
    stack = [condition] if condition is not None else []
    while stack:
        node = stack.pop().unnest()
        if isinstance(node, exp.And):
            stack.extend((node.expression, node.this))
        else:
            out.append(node)
    return out


def _predicate_key(pred: exp.Expression) -> str:
    """Canonical text of one predicate, independent of operand order where that is free."""
    if isinstance(pred, (exp.EQ, exp.NEQ)):
        left, right = sorted((_bare(pred.this), _bare(pred.expression)))
        op = "=" if isinstance(pred, exp.EQ) else "<>"
        return f"{left} {op} {right}"
    flipped = _FLIP.get(type(pred))
    if flipped is not None and isinstance(pred.this, exp.Literal) and not isinstance(
        pred.expression, exp.Literal
    ):
        pred = flipped(this=pred.expression.copy(), expression=pred.this.copy())
    return _bare(pred)


def _components_of(tree: exp.Expression) -> dict[str, set[str]]:
    parts: dict[str, set[str]] = {name: set() for name in COMPONENTS}
    for select in tree.find_all(exp.Select):
        parts["select"].update(map(_bare, select.expressions))
        if select.args.get("distinct"):
            parts["distinct"].add("distinct")
        where = select.args.get("where")
        parts["conditions"].update(map(_predicate_key, _conjuncts(where.this if where else None)))
        for join in select.args.get("joins") or []:
            parts["conditions"].update(map(_predicate_key, _conjuncts(join.args.get("on"))))
        having = select.args.get("having")
        parts["having"].update(map(_predicate_key, _conjuncts(having.this if having else None)))
        group = select.args.get("group")
        parts["group_by"].update(map(_bare, group.expressions if group else []))
    for order in tree.find_all(exp.Order):
        for item in order.expressions:
            if isinstance(item, exp.Ordered):
                direction = "desc" if item.args.get("desc") else "asc"
                parts["order_by"].add(f"{_bare(item.this)} {direction}")
    for limit in tree.find_all(exp.Limit):
        if limit.expression is not None:
            parts["limit"].add(f"limit {_bare(limit.expression)}")
    for offset in tree.find_all(exp.Offset):
        if offset.expression is not None:
            parts["limit"].add(f"offset {_bare(offset.expression)}")
    parts["tables"].update(table.name for table in tree.find_all(exp.Table) if table.name)
    parts["columns"].update(column.name for column in tree.find_all(exp.Column) if column.name)
    if tree.find(exp.Star) is not None:
        parts["columns"].add("*")
    parts["aggregates"].update(map(_bare, tree.find_all(exp.AggFunc)))
    for setop in tree.find_all(exp.SetOperation):
        word = type(setop).__name__.lower()
        if isinstance(setop, exp.Union) and not setop.args.get("distinct", True):
            word += " all"
        parts["set_ops"].add(word)
    return parts


def sql_components(sql: str) -> dict[str, set[str]]:
    """The query's components as sets of normalised strings, keyed by ``COMPONENTS``.

    ``select`` (output expressions), ``tables``, ``columns`` (bare names, ``*`` for a star),
    ``aggregates`` (``count(*)``, ``max(age)``), ``conditions`` (WHERE and JOIN ON conjuncts),
    ``having`` (HAVING conjuncts), ``group_by``, ``order_by`` (``expr asc|desc``), ``limit``
    (``limit n`` / ``offset n``), ``distinct`` and ``set_ops`` (``union``, ``union all``,
    ``intersect``, ``except``). Returns an empty dict when ``sql`` is not a valid query.
    """
    tree = parse_query(sql)
    if tree is None:
        return {}
    try:
        return _components_of(normalise(tree))
    except Exception:  # sqlglot can fail rendering odd trees; no components then
        logger.debug("could not compute components of %r", sql[:200], exc_info=True)
        return {}


def _f1(pred: set[str], gold: set[str]) -> float:  # never both empty: partial_credit skips those
    return 2.0 * len(pred & gold) / (len(pred) + len(gold))


def partial_credit(pred_sql: str, gold_sql: str) -> float:
    """Structural similarity in [0, 1]: the mean F1 over components present in either query; 0.0
    when either is not a valid query (an invalid gold is logged)."""
    pred = sql_components(pred_sql)
    if not pred:
        return 0.0
    gold = sql_components(gold_sql)
    if not gold:
        logger.warning("gold SQL does not parse with sqlglot; partial credit is 0: %r", gold_sql[:200])
        return 0.0
    scores = [_f1(pred[name], gold[name]) for name in COMPONENTS if pred[name] or gold[name]]
    if not scores:  # nothing to compare (cannot happen for a query with a SELECT list)
        return 1.0 if normalised_sql(pred_sql) == normalised_sql(gold_sql) else 0.0
    return sum(scores) / len(scores)


def _literals(tree: exp.Expression) -> Counter[str]:
    """The query's literal values, strings quoted (`'1970'` and `1970` differ, as in SQLite)."""
    return Counter(f"'{lit.this}'" if lit.is_string else str(lit.this) for lit in tree.find_all(exp.Literal))


def literal_match(pred_sql: str, gold_sql: str) -> float:
    """F1 in [0, 1] between the two queries' literals, as multisets: whether the answer wrote the
    constants the question states (most of the shipped start's wrong answers differ from the gold
    query by one literal only). 1.0 when neither has a literal; 0.0 when either is not a valid query."""
    pred, gold = parse_query(pred_sql), parse_query(gold_sql)
    if pred is None or gold is None:
        return 0.0
    pred_literals, gold_literals = _literals(pred), _literals(gold)
    if not pred_literals and not gold_literals:
        return 1.0
    both = sum((pred_literals & gold_literals).values())
    return 2.0 * both / (sum(pred_literals.values()) + sum(gold_literals.values()))
