"""MCP server with read-only SQLite tools: list_tables, describe_table, sample_rows, get_schema, execute_sql.

Run over stdio:

    python -m mcp_tools.sqlite_server --db-root DIR   # Spider layout DIR/<db_id>/<db_id>.sqlite
    python -m mcp_tools.sqlite_server --db PATH       # one database; db_id is optional and ignored

Options: --timeout-s (5), --max-rows (200), --max-chars (8000), --max-open-dbs (32),
--memory-limit-mb (256), --express-threads (16), --log-level.

One process serves both the schema tools and the query tool: schema lookups and queries hit the
same databases, so one process per DB root keeps one warm cache of open connections and parsed
schemas instead of two, and halves the number of processes per rollout worker. Nothing needs the
split (both are read-only and sandboxed alike).

Every query goes through `mcp_tools.sandbox` (the security boundary) on a worker thread, never on
the event loop, from `mcp_tools.call_lanes`: one slow query must not hold up the calls beside it,
nor many slow ones a cheap call. A watchdog a little past the query timeout answers even if
SQLite is stuck inside one operation. Started as a program, the
server caps its own memory (`process_memory.apply_server_limits`: RSS over its footprint at
start, SQLite heap, address space), and after a call that grew its RSS hands what the query freed
back to the OS (`process_memory.release_freed_memory`).
Every refused or failed call is an MCP error result (`is_error=True`) whose text tells the model
what went wrong and quotes at most a clipped piece of the input; the server itself never crashes
on input. Text output is compact (a small model reads it): tables as `col | col` lines, at most
`MAX_RESULT_COLUMNS` columns. The stdio transport is `mcp_tools.fast_stdio` (the SDK's, minus
thread hops).
"""

# No `from __future__ import annotations`: the SDK reads the tools' Annotated parameter types.
import argparse
import inspect
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent
from pydantic import Field

from mcp_tools.call_lanes import EXPRESS_THREADS, CallLanes
from mcp_tools.fast_stdio import fast_stdio_server
from mcp_tools.process_memory import MEMORY_LIMIT_MB, apply_server_limits, memory_error_message, release_freed_memory
from mcp_tools.result_caps import MAX_ERROR_CHARS, MAX_RESPONSE_BYTES, json_size
from mcp_tools.result_rows import jsonable_cell
from mcp_tools.sandbox import QueryResult, SandboxError, run_query
from mcp_tools.sandbox_limits import clip_echo
from mcp_tools.sqlite_catalog import Catalog, CatalogError, ColumnInfo, TableInfo, find_table, quote_ident

logger = logging.getLogger(__name__)

MAX_SAMPLE_ROWS = 20
#: Longest cell shown in text output (structured content keeps the value).
MAX_CELL_CHARS = 200
#: Result columns returned (the rest are dropped and the truncation note says how many).
MAX_RESULT_COLUMNS = 100

DbId = Annotated[str, Field(description="Database id.")]
TableName = Annotated[str, Field(description="Table name.")]
Sql = Annotated[str, Field(description="One SQLite SELECT statement.")]
NRows = Annotated[int, Field(description="Rows to show (max 20).")]
IgnoredDbId = Annotated[str, Field(description="Ignored: this server has one database.")]


# ----------------------------------------------------------------------------- text rendering


def _cell_text(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        text = repr(value)
        return text if len(text) <= 12 else f"{value:.8g}"
    if isinstance(value, bytes):
        return f"<blob {len(value)} bytes>"
    text = str(value).replace("\n", "\\n").replace("\r", "\\r")
    return text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS] + "…"


def _fit(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit, 0)] + "…"


def render_table(result: QueryResult, max_chars: int) -> str:
    """`a | b` header, one line per row, `(no rows)` if empty, `... truncated` when cut.

    At most about `max_chars` characters plus the note: the header gets half, and a first row
    that does not fit is clipped rather than dropped.
    """
    header = " | ".join(_cell_text(c) for c in result.columns) if result.columns else "(no columns)"
    lines = [_fit(header, max_chars // 2)]
    size = len(lines[0])
    truncated = result.truncated
    clipped = False
    for row in result.rows:
        line = " | ".join(_cell_text(v) for v in row)
        if size + len(line) + 1 > max_chars:
            truncated = True
            if len(lines) > 1:
                break
            clipped = True
            line = _fit(line, max_chars - size - 1)
        lines.append(line)
        size += len(line) + 1
        if clipped:
            break
    if len(lines) == 1 and not result.rows:
        lines.append("(no rows)")
    if truncated:
        notes = [f"{len(lines) - 1} rows shown"]
        if result.omitted_columns:
            shown = len(result.columns)
            notes.append(f"first {shown} of {shown + result.omitted_columns} columns")
        if clipped:
            notes.append("long values clipped")
        lines.append(f"... truncated ({'; '.join(notes)})")
    return "\n".join(lines)


def query_tool_result(result: QueryResult, max_chars: int) -> CallToolResult:
    """Text table for the model plus structured {columns, rows, row_count, truncated}; rows are
    dropped from the end until both parts together encode (JSON, ASCII) within
    `MAX_RESPONSE_BYTES` (control characters escape to six bytes each: a 8,000-character answer
    was a 144 KB response)."""
    for _ in range(64):
        response = _query_tool_result(result, max_chars)
        size = json_size(response.structured_content) + json_size(response.content[0].text)
        if size <= MAX_RESPONSE_BYTES:
            return response
        if result.rows:
            keep = min(len(result.rows) - 1, len(result.rows) * MAX_RESPONSE_BYTES // size)
            result = QueryResult(result.columns, result.rows[:keep], True, keep, result.omitted_columns)
        else:  # no rows left: the column names themselves are too big
            short = max(8, max_chars // 2 // max(1, len(result.columns)) // 6)
            result = QueryResult([c[:short] for c in result.columns], [], True, 0, result.omitted_columns)
            max_chars = max(1, max_chars // 2)
    return text_result("too large: the result does not fit in a response", is_error=True)


def _query_tool_result(result: QueryResult, max_chars: int) -> CallToolResult:
    structured: dict[str, Any] = {
        # Names can be expression text as long as the query itself.
        "columns": [_fit(c, MAX_CELL_CHARS) for c in result.columns],
        "rows": [[jsonable_cell(v) for v in row] for row in result.rows],
        "row_count": result.row_count,
        "truncated": result.truncated,
    }
    if result.omitted_columns:
        structured["omitted_columns"] = result.omitted_columns
    text = render_table(result, max_chars)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)


def _column_text(col: ColumnInfo, fks: dict[str, str]) -> str:
    parts = [col.name]
    if col.type:
        parts.append(col.type)
    if col.pk:
        parts.append("PK")
    if col.name in fks:
        parts.append(f"FK->{fks[col.name]}")
    return " ".join(parts)


def _fk_map(table: TableInfo) -> dict[str, str]:
    return {frm: f"{ref}.{to}" if to else ref for frm, ref, to in table.foreign_keys}


def describe_text(table: TableInfo) -> str:
    """`name: N rows` then one `column TYPE [PK] [FK->t.c]` line per column."""
    rows = "? rows" if table.row_count is None else f"{table.row_count} rows"
    fks = _fk_map(table)
    return "\n".join([f"{table.name}: {rows}"] + [_column_text(c, fks) for c in table.columns])


def schema_text(tables: list[TableInfo], max_chars: int) -> str:
    """One `table(col TYPE PK, col TYPE FK->t.c, ...)` line per table, cut at `max_chars`."""
    lines: list[str] = []
    size = 0
    for i, table in enumerate(tables):
        fks = _fk_map(table)
        line = f"{table.name}({', '.join(_column_text(c, fks) for c in table.columns)})"
        if size + len(line) + 1 > max_chars and lines:
            lines.append(f"... {len(tables) - i} more tables; use list_tables and describe_table")
            break
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) if lines else "(no tables)"


# ----------------------------------------------------------------------------- server


def text_result(text: str, *, is_error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=is_error)


class SqliteTools:
    """The tool bodies, bound to one Catalog and the output limits.

    Every call body runs on a worker thread from `CallLanes` (a cheap call does not wait behind
    slow ones), under a watchdog a little past the timeout.

    Anticipated failures come back as `CallToolResult(is_error=True)` built here rather than as a
    raised ToolError: the SDK would prefix every message with "Error executing tool <name>: ",
    tokens a small model does not need.
    """

    def __init__(self, catalog: Catalog, *, timeout_s: float, max_rows: int, max_chars: int,
                 express_threads: int = EXPRESS_THREADS) -> None:
        self.catalog = catalog
        self.timeout_s = timeout_s
        self.max_rows = max_rows
        self.max_chars = max_chars
        self.lanes = CallLanes(timeout_s, express_threads=express_threads)

    async def _run(self, work: Callable[[float], CallToolResult], what: str, *,
                   takes_budget: bool = True) -> CallToolResult:
        """`work(timeout_s)` on a worker thread (`CallLanes.run`); errors and the watchdog's give-up
        come back as error results."""

        def body(timeout_s: float) -> CallToolResult:
            try:
                return work(timeout_s)
            finally:
                # What a large query freed goes back to the OS before this thread serves another
                # call (only when RSS grew; process_memory.release_freed_memory).
                release_freed_memory()

        try:
            result = await self.lanes.run(body, takes_budget=takes_budget)
        except (SandboxError, CatalogError) as exc:
            return text_result(str(exc), is_error=True)
        except MemoryError:  # Python's side hit the address-space cap (apply_server_limits)
            return text_result(f"too large: {memory_error_message()}", is_error=True)
        if result is not None:
            return result
        # Only reached when SQLite is stuck inside one operation (or the machine is starved); the
        # thread finishes on its own, and the operation's cost is bounded (sandbox_limits).
        return text_result(f"timeout: {what} ran longer than {self.timeout_s:g} s and was interrupted", is_error=True)

    def _query(self, db_id: str, sql: str, max_rows: int, timeout_s: float) -> CallToolResult:
        with self.catalog.connection(db_id) as conn:
            result = run_query(
                conn,
                sql,
                timeout_s=timeout_s,
                max_rows=max_rows,
                max_chars=self.max_chars,
                max_columns=MAX_RESULT_COLUMNS,
            )
        return query_tool_result(result, self.max_chars)

    async def _schema(self, db_id: str, render: Callable[[list[TableInfo]], str]) -> CallToolResult:
        """Render the cached schema inline; the first load (row counts) runs on a worker thread."""
        try:
            tables = self.catalog.loaded_tables(db_id)
        except CatalogError as exc:
            return text_result(str(exc), is_error=True)
        if tables is not None:
            try:
                return text_result(render(tables))
            except CatalogError as exc:
                return text_result(str(exc), is_error=True)
        return await self._run(lambda _t: text_result(render(self.catalog.tables(db_id))), "reading the schema",
                               takes_budget=False)

    async def list_tables(self, db_id: DbId) -> CallToolResult:
        """List the tables in a database."""
        return await self._schema(db_id, lambda tables: ", ".join(t.name for t in tables) or "(no tables)")

    async def describe_table(self, db_id: DbId, table: TableName) -> CallToolResult:
        """Show a table's columns (type, PK, FK) and row count."""
        return await self._schema(db_id, lambda tables: describe_text(find_table(tables, table)))

    async def sample_rows(self, db_id: DbId, table: TableName, n: NRows = 3) -> CallToolResult:
        """Show the first n rows of a table."""
        n = max(1, min(n, MAX_SAMPLE_ROWS))

        def work(timeout_s: float) -> CallToolResult:
            name = self.catalog.table(db_id, table).name
            return self._query(db_id, f"SELECT * FROM {quote_ident(name)} LIMIT {n}", n, timeout_s)

        return await self._run(work, "the query")

    async def get_schema(self, db_id: DbId) -> CallToolResult:
        """Compact schema of the whole database: one line per table (columns, PK, FK)."""
        return await self._schema(db_id, lambda tables: schema_text(tables, self.max_chars))

    async def execute_sql(self, db_id: DbId, sql: Sql) -> CallToolResult:
        """Run one read-only SQLite query; returns at most 200 rows."""
        return await self._run(lambda timeout_s: self._query(db_id, sql, self.max_rows, timeout_s), "the query")


TOOL_NAMES = ("list_tables", "describe_table", "sample_rows", "get_schema", "execute_sql")


def _db_id_optional(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The same tool with `db_id` defaulting to "" (single-database mode ignores it)."""

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        return await fn(*args, **kwargs)

    sig = inspect.signature(fn)
    params = [
        p.replace(default="", annotation=IgnoredDbId) if p.name == "db_id" else p for p in sig.parameters.values()
    ]
    # db_id moves behind the required parameters so the signature stays valid.
    params.sort(key=lambda p: p.default is not inspect.Parameter.empty)
    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


class _SqliteMCPServer(MCPServer):
    """MCPServer whose tool-call error texts are clipped to `MAX_ERROR_CHARS`."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            # The SDK's own errors quote the caller's input ("Unknown tool: <name>"; a 1 MB name
            # made a 1 MB answer). Same exception, shorter text, so the SDK reports it as before.
            text = str(exc)
            if len(text) > MAX_ERROR_CHARS:
                exc.args = (clip_echo(text, MAX_ERROR_CHARS),)
            raise


def build_server(
    catalog: Catalog,
    *,
    timeout_s: float = 5.0,
    max_rows: int = 200,
    max_chars: int = 8000,
    log_level: str = "WARNING",
    express_threads: int = EXPRESS_THREADS,
) -> MCPServer:
    """An MCPServer exposing the five SQLite tools over `catalog`."""
    tools = SqliteTools(catalog, timeout_s=timeout_s, max_rows=max_rows, max_chars=max_chars,
                        express_threads=express_threads)
    server = _SqliteMCPServer(
        "sqlite",
        instructions="Read-only SQLite tools. Explore the schema, then query with execute_sql.",
        log_level=log_level,  # type: ignore[arg-type]
    )
    for name in TOOL_NAMES:
        fn = getattr(tools, name)
        description = fn.__doc__
        if name == "execute_sql":
            description = f"Run one read-only SQLite query; returns at most {max_rows} rows."
        if catalog.single:
            fn = _db_id_optional(fn)
        # No output schema: it would add tokens to every tool listing and duplicate the text.
        server.add_tool(fn, name=name, description=description, structured_output=False)
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--db-root", type=Path, help="Spider layout: DIR/<db_id>/<db_id>.sqlite")
    where.add_argument("--db", type=Path, help="one database file; the db_id argument is ignored")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="per-query wall-clock limit")
    parser.add_argument("--max-rows", type=int, default=200, help="rows returned per query")
    parser.add_argument("--max-chars", type=int, default=8000, help="characters of text per result")
    parser.add_argument("--max-open-dbs", type=int, default=32, help="databases kept open (LRU)")
    parser.add_argument(
        "--memory-limit-mb", type=int, default=MEMORY_LIMIT_MB,
        help="RSS the queries may add to the process's footprint at start; also its SQLite heap cap (0: none)"
    )
    parser.add_argument("--express-threads", type=int, default=EXPRESS_THREADS,
                        help="threads that try calls briefly while the main ones are busy (0: none; call_lanes)")
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    try:
        catalog = Catalog(
            db_root=args.db_root, db_path=args.db, max_open_dbs=args.max_open_dbs, timeout_s=args.timeout_s
        )
    except ValueError as exc:
        parser.error(str(exc))
    server = build_server(
        catalog, timeout_s=args.timeout_s, max_rows=args.max_rows, max_chars=args.max_chars, log_level=args.log_level,
        express_threads=args.express_threads,
    )
    # Process-wide caps, so only here (a program of its own), not in build_server (tests, benchmarks);
    # after the imports and setup, whose address space the limit builds on.
    apply_server_limits(args.memory_limit_mb)
    try:
        anyio.run(serve_stdio, server)
    finally:
        catalog.close()


async def serve_stdio(server: MCPServer) -> None:
    """`server.run("stdio")` over `fast_stdio_server` (no thread hop per message)."""
    lowlevel = server._lowlevel_server  # what MCPServer.run_stdio_async drives; no public accessor
    async with fast_stdio_server() as (read_stream, write_stream):
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())


if __name__ == "__main__":
    main()
