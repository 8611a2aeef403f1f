"""Whether a user's SQL is one read-only statement without external access, decided on
ClickHouse's own parse of it, on the engine that will run it.

Two questions go to the engine before a statement text first runs (a text that passed is
remembered; a refused one is asked about again each time):
1. `formatQuerySingleLine('<the text as a string literal>')`: ClickHouse parses the text as
   data, so nothing in it runs, and refuses more than one statement.
2. `EXPLAIN AST <the statement>` (now known to be one statement): the parse tree, walked here.

Refused, each by name: statements other than SELECT/SHOW/DESCRIBE/EXISTS/EXPLAIN of those
(writes inside EXPLAIN too); table functions outside TABLE_FUNCTIONS; functions that read
files, dictionaries or run programs (`file`, `dictGet`..., executable UDFs) anywhere;
any table function name in any position; `INTO OUTFILE`; `SETTINGS` clauses (settings
go as parameters, checked against SETTINGS). The tree's text dump does not escape
identifiers, so a name can inject lines; the rules only ever look for lines that a real node
prints (a real node's line cannot be hidden or re-indented by a name), so an injected line
can only make a query refused, never let one through.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rlbus.bus.store.sqltext import read_only_problem, split_statements

TABLE_FUNCTIONS = frozenset(
    {"numbers", "numbers_mt", "zeros", "zeros_mt", "values", "generate_series", "generateseries"}
)
"""Table functions a reader may use (lower-case): they make rows from their arguments alone
(series for gap filling, inline constants). None reads a file, a URL, another server, a
dictionary or a table by pattern, or runs anything."""

SETTINGS = frozenset(
    {
        "max_result_rows",
        "max_result_bytes",
        "result_overflow_mode",
        "max_execution_time",
        "timeout_overflow_mode",
        "max_rows_to_read",
        "max_bytes_to_read",
        "read_overflow_mode",
        "max_threads",
        "max_memory_usage",
        "max_block_size",
        "output_format_json_quote_64bit_integers",
        "output_format_arrow_string_as_string",
        "output_format_native_write_json_as_string",
        "date_time_output_format",
        "date_time_input_format",
        "cast_string_to_dynamic_use_inference",
        "cancel_http_readonly_queries_on_client_close",
        "send_progress_in_http_headers",
        "http_headers_progress_interval_ms",
        "wait_end_of_query",
        "session_timezone",
        "use_query_cache",
    }
)
"""Query settings a reader may pass: limits and output shape. Nothing here names a path
(format_schema, format_template_*, output_format_schema read or write files) or loosens
access (readonly, allow_*)."""

PASSED_KEPT = 4096
"""Statement texts whose passing parse a guard remembers (the oldest forgotten first): the ui
sends a few dozen fixed texts; a console user's texts come and go."""

_IDENTIFIER_PARAMETER = re.compile(r"\{\s*(\w+)\s*:\s*Identifier\s*\}", re.IGNORECASE)
"""`{name:Identifier}`: a parameter substituted into the parse as a name, not a value."""

DENIED_SCALARS = ("file", "catboostevaluate")
"""Ordinary functions that read a file named by their argument."""

_DENIED_NAMES_SQL = """
SELECT lower(name) FROM system.table_functions
WHERE name NOT IN (SELECT name FROM system.functions) AND lower(name) NOT IN {allowed}
UNION ALL
SELECT lower(name) FROM system.functions
WHERE origin = 'ExecutableUserDefined' OR lower(name) LIKE 'dict%'
   OR lower(name) IN {denied} OR lower(alias_to) IN {denied} OR lower(alias_to) LIKE 'dict%'
""".format(denied=repr(DENIED_SCALARS), allowed=repr(tuple(sorted(TABLE_FUNCTIONS))))
"""Function names refused in any position, from the engine itself: every table function that
is neither allowed nor also an ordinary function, the dictionary functions, executable
user-defined functions and DENIED_SCALARS (with their aliases)."""

_VIEWS_SQL = """
SELECT lower(name) FROM system.tables
WHERE database = currentDatabase() AND engine = 'View' AND position(as_select, '{') > 0
"""
"""The store's parameterized views (`scores_at(version = ...)`): written by its migrations, read
as table functions are, and reading nothing but the store."""

Run = Callable[[str, Mapping[str, Any] | None], list[str]]
"""Runs a query on the engine that will run the statement; returns its output's lines."""


class Refused(ValueError):
    """A query that read-only access refuses; the message names what."""


def string_literal(text: str) -> str:
    """`text` as a ClickHouse string literal: with every backslash and quote escaped, nothing
    in it can end the literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Guard:
    """Checks statements for one engine; the names it refuses are read from it once. A
    statement the engine's parse passed is remembered by its text (the same text parses the
    same), with the values of any Identifier parameters, which the parse substitutes as names;
    a refusal is never remembered, so each refused statement is parsed and refused again."""

    def __init__(self) -> None:
        self._denied: frozenset[str] | None = None
        self._views: frozenset[str] = frozenset()
        self._passed: OrderedDict[tuple, str] = OrderedDict()
        """A passed text's key (see _passed_key) -> its statement."""
        self._passed_lock = threading.Lock()

    def denied(self, run: Run) -> frozenset[str]:
        if self._denied is None:
            self._denied = frozenset(run(_DENIED_NAMES_SQL, None))
        return self._denied

    def statement(self, sql: str, parameters: Mapping[str, Any] | None, run: Run) -> str:
        """The one read-only statement in `sql` (without a trailing `;` or comments), checked
        with its bound `parameters` on the engine `run` reaches; raises Refused naming what
        is refused. Syntax errors come back as the engine's own."""
        key = _passed_key(sql, parameters)
        with self._passed_lock:
            statement = self._passed.get(key)
            if statement is not None:
                self._passed.move_to_end(key)
                return statement
        if problem := read_only_problem(sql):  # a cheap first gate; the parse decides
            raise Refused(problem)
        statement = split_statements(sql)[0]
        try:
            run(f"SELECT formatQuerySingleLine({string_literal(statement)})", None)
        except Exception as exc:
            if "Multi-statements are not allowed" in str(exc):
                raise Refused("more than one statement; send one statement at a time") from None
            raise
        lines = run(f"EXPLAIN AST {statement}", parameters)
        problem = tree_problem(lines, self.denied(run), self._views)
        if problem is not None and problem.startswith(MISSING_TABLE_FUNCTION):
            # a migration may have added a view since: ask the engine again before refusing
            self._views = frozenset(run(_VIEWS_SQL, None))
            problem = tree_problem(lines, self.denied(run), self._views)
        if problem is not None:
            raise Refused(problem)
        with self._passed_lock:
            self._passed[key] = statement
            while len(self._passed) > PASSED_KEPT:
                self._passed.popitem(last=False)
        return statement


def _passed_key(sql: str, parameters: Mapping[str, Any] | None) -> tuple:
    """What a passing parse depends on: the text, and the values substituted into it as names."""
    names = sorted({m.group(1) for m in _IDENTIFIER_PARAMETER.finditer(sql)})
    return (sql, *((n, str((parameters or {}).get(n))) for n in names))


def check_settings(names: Iterable[str]) -> None:
    """Raise Refused for a query setting outside SETTINGS, naming it."""
    refused = sorted(n for n in names if n not in SETTINGS)
    if refused:
        raise Refused(
            f"setting {', '.join(refused)} cannot be changed by a reader "
            f"(allowed: {', '.join(sorted(SETTINGS))})"
        )


def check_threads(settings: Mapping[str, str], cores: int) -> None:
    """Raise Refused for a max_threads above `cores`: the engine of a chdb store keeps every
    thread a query starts, idle, for the life of the process that holds it (its memory crept
    with ~150 of them: docs/benchmarks.md, the sink's creep)."""
    asked = settings.get("max_threads", "auto").strip()
    if asked.lower() == "auto":
        return
    if not asked.isdigit() or int(asked) > cores:
        raise Refused(
            f"max_threads {asked} is more than the {cores} cores of the process holding the "
            f"store, whose engine would keep each thread it started: ask for {cores} or fewer"
        )


def _kind(line: str) -> str:
    return line.lstrip(" ").split(" ", 1)[0]


def _depth(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


_READ_KINDS = ("select", "show", "describe", "exists", "explain")
_TABLE_PARENTS = ("TableExpression", "Explain")


def _function_name(line: str) -> str:
    """The name of a `Function NAME ...` line."""
    return line.lstrip(" ")[len("Function ") :].split(" ", 1)[0]


MISSING_TABLE_FUNCTION = "table function "


def tree_problem(
    lines: list[str], denied: frozenset[str], views: frozenset[str] = frozenset()
) -> str | None:
    """Why the `EXPLAIN AST` dump `lines` is not a read-only statement, or None. `views`: the
    store's parameterized views, allowed where table functions go."""
    lines = [part for line in lines for part in line.split("\n")]
    if not lines or not lines[0]:
        return "the engine returned no parse tree"
    root = _kind(lines[0])
    if not root.lower().startswith(_READ_KINDS):
        return f"{root} statements are refused (read-only access allows SELECT, SHOW, ...)"
    for i, line in enumerate(lines):
        kind, depth = _kind(line), _depth(line)
        if depth == 1 and kind == "Literal":
            return "INTO OUTFILE writes a file, which read-only access refuses"
        explained = kind.lower().startswith(_READ_KINDS) or kind == "Identifier"  # FORMAT name
        if depth == 1 and root == "Explain" and not explained:
            return f"EXPLAIN of {kind} is refused (only reads may be explained)"
        if kind == "Set" and line.strip() == "Set":
            return (
                "SETTINGS clauses (and EXPLAIN options) are refused in the query text; pass "
                "allowed settings as parameters"
            )
        if kind != "Function":
            continue
        name = _function_name(line)
        names = {name.lower(), name.rsplit(".", 1)[-1].lower()}  # `db.file` is `file` too
        parent = lines[i - 1] if i else ""
        in_table = _kind(parent) in _TABLE_PARENTS and _depth(parent) == depth - 1
        if in_table and not names & (TABLE_FUNCTIONS | views) and not names & denied:
            return (
                f"{MISSING_TABLE_FUNCTION}{name}() is refused: it is neither a parameterized "
                "view of the store nor an allowed table function (allowed: "
                f"{', '.join(sorted(TABLE_FUNCTIONS))})"
            )
        if names & denied:
            return (
                f"{name}() is refused: read-only access reads no file, URL, other server, "
                "dictionary or program (table functions allowed: "
                f"{', '.join(sorted(TABLE_FUNCTIONS))})"
            )
    return None
