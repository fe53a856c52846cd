"""sqlglot helpers shared by the reward functions: parse, normalise, inspect SQLite queries.

Normalisation (``normalise``) makes two spellings of the same query render identically:

* identifiers are lower-cased and unquoted (SQLite identifiers are case-insensitive);
* a double-quoted name compared with a column (``name = "Bob"``, ``x IN ("a", "b")``,
  ``LIKE "%a%"``) becomes a string literal: SQLite falls back to a string for an unknown
  double-quoted identifier, and Spider's gold SQL relies on that habitually;
* table aliases are replaced by the table name when that table occurs once in the query
  scope (``T1.name`` -> ``singer.name``); self-joins keep their (lower-cased) aliases;
* in a scope reading a single table, column qualifiers are dropped (``singer.name`` -> ``name``).

Every function here is total: sqlglot failures become ``None``/``False``, never exceptions.
"""

from __future__ import annotations

import logging

import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType

logger = logging.getLogger(__name__)

#: SQL longer than this is not parsed (a degenerate generation: sqlglot took 4.2 s on one of 16,000
#: characters). Spider's longest gold query is under 600.
MAX_SQL_CHARS = 8_000
DIALECT = "sqlite"

_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Like, exp.ILike, exp.Glob)


def parse_query(sql: str) -> exp.Expression | None:
    """Parse ``sql`` as exactly one SQLite query (SELECT / set operation / WITH ... SELECT), else None."""
    if not isinstance(sql, str) or len(sql) > MAX_SQL_CHARS:
        return None
    try:
        trees = [t for t in sqlglot.parse(sql, read=DIALECT) if t is not None]
    except Exception:  # sqlglot raises ParseError/TokenError, and on odd input other errors too
        return None
    if len(trees) != 1 or not isinstance(trees[0], exp.Query):
        return None
    return trees[0]


def _scope_tables(select: exp.Select) -> list[exp.Table]:
    """Tables read directly by this SELECT (FROM and JOINs), not by its subqueries."""
    return [t for t in select.find_all(exp.Table) if t.parent_select is select]


def _literalise(node: exp.Expression | None) -> None:
    """An unqualified quoted column (``"Bob"``) used as a value becomes a string literal, in place."""
    if isinstance(node, exp.Column) and not node.table and isinstance(node.this, exp.Identifier) and node.this.quoted:
        node.replace(exp.Literal.string(node.this.this))


def _literalise_quoted_values(tree: exp.Expression) -> None:
    for cmp in list(tree.find_all(*_COMPARISONS)):
        if isinstance(cmp.this, exp.Column) and isinstance(cmp.expression, exp.Column):
            _literalise(cmp.expression)
    for node in list(tree.find_all(exp.In)):
        for item in list(node.expressions):
            _literalise(item)
    for node in list(tree.find_all(exp.Between)):
        _literalise(node.args.get("low"))
        _literalise(node.args.get("high"))


def _resolve_aliases(tree: exp.Expression) -> None:
    """Replace table aliases by table names where unambiguous; drop qualifiers in 1-table scopes."""
    alias_maps: dict[int, dict[str, str | None]] = {}
    single_table: dict[int, str | None] = {}
    for select in tree.find_all(exp.Select):
        tables = _scope_tables(select)
        names = [t.name for t in tables]
        mapping: dict[str, str | None] = {}
        for table in tables:
            unique = names.count(table.name) == 1
            if table.alias:
                mapping[table.alias] = table.name if unique else None
                if unique:
                    table.set("alias", None)
        alias_maps[id(select)] = mapping
        has_subquery_source = any(
            isinstance(s, exp.Subquery) and s.parent_select is select
            for s in select.find_all(exp.Subquery)
            if isinstance(s.parent, (exp.From, exp.Join))
        )
        single_table[id(select)] = names[0] if len(names) == 1 and not has_subquery_source else None
    for column in list(tree.find_all(exp.Column)):
        qualifier = column.table
        scope = column.parent_select
        if qualifier:
            owner = scope
            while owner is not None:  # correlated subqueries may use an outer alias
                mapping = alias_maps.get(id(owner), {})
                if qualifier in mapping:
                    if mapping[qualifier] is not None:
                        column.set("table", exp.to_identifier(mapping[qualifier]))
                    break
                owner = owner.parent_select
            if scope is not None and single_table.get(id(scope)) == column.table:
                column.set("table", None)


def normalise(tree: exp.Expression) -> exp.Expression:
    """A normalised copy of a parsed query (see the module docstring)."""
    tree = tree.copy()
    _literalise_quoted_values(tree)
    for ident in tree.find_all(exp.Identifier):
        ident.set("this", ident.this.lower())
        ident.set("quoted", False)
    _resolve_aliases(tree)
    return tree


def render(tree: exp.Expression) -> str:
    """Deterministic SQLite text of an expression (identifiers quoted only when needed)."""
    return tree.sql(dialect=DIALECT, normalize_functions="lower")


def normalised_sql(sql: str) -> str | None:
    """The normalised text of ``sql``, or None if it is not a single parseable query."""
    tree = parse_query(sql)
    if tree is None:
        return None
    try:
        return render(normalise(tree))
    except Exception:  # rendering odd ASTs can fail inside sqlglot; treat as unparseable
        logger.debug("could not normalise %r", sql[:200], exc_info=True)
        return None


def has_top_level_order_by(sql: str) -> bool | None:
    """Whether the outermost query has an ORDER BY (a subquery's does not order the result); None
    when ``sql`` does not parse."""
    tree = parse_query(sql)
    if tree is None:
        return None
    while isinstance(tree, exp.Subquery):  # "(SELECT ... ORDER BY x)" as the whole statement
        if tree.args.get("order"):
            return True
        tree = tree.this
    return bool(tree.args.get("order"))


def remove_distinct_tokens(sql: str) -> str | None:
    """Delete every DISTINCT keyword (including ``COUNT(DISTINCT x)``), as the official Spider
    evaluator does unless run with ``--keep_distinct``. Returns None if ``sql`` does not tokenize.
    """
    try:
        tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(sql)
    except Exception:
        return None
    pieces: list[str] = []
    pos = 0
    for token in tokens:
        if token.token_type == TokenType.DISTINCT:
            pieces.append(sql[pos : token.start])
            pos = token.end + 1
    pieces.append(sql[pos:])
    return "".join(pieces)
