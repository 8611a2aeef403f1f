"""Just enough of ClickHouse's lexer to split a script on `;` and to tell a read from a write.

Quotes, heredocs and comments follow ClickHouse's rules, so a `;` or a keyword inside them
changes nothing. Where this lexer and ClickHouse could disagree, it errs towards seeing more
statements and more keywords: the read-only endpoint then refuses a query rather than running
a hidden second statement.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Iterator
from itertools import pairwise


class SqlTextError(ValueError):
    """SQL text that cannot be lexed (an unterminated quote or comment); says where."""


class Tok(enum.Enum):
    WORD = "word"
    QUOTED = "quoted"
    COMMENT = "comment"
    SEMICOLON = "semicolon"
    OTHER = "other"


READ_STATEMENTS = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN")

_WORD = re.compile(r"[^\W\d][\w$]*")
_HEREDOC = re.compile(r"\$(\w*)\$")
_SPACE = " \t\r\n\f\v"


def _quoted_end(sql: str, start: int) -> int:
    """End of a '...', "..." or `...` token: backslash escapes, and a doubled quote is literal."""
    quote, i, n = sql[start], start + 1, len(sql)
    while i < n:
        c = sql[i]
        if c == "\\":
            i += 2
        elif c == quote:
            if sql[i + 1 : i + 2] != quote:
                return i + 1
            i += 2
        else:
            i += 1
    raise SqlTextError(
        f"unterminated {quote} quote starting at position {start}: {sql[start : start + 40]!r}"
    )


def _block_comment_end(sql: str, start: int) -> int:
    """ClickHouse block comments nest."""
    depth, i = 0, start
    while i < len(sql):
        if sql.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif sql.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    raise SqlTextError(f"unterminated /* comment starting at position {start}")


def sql_tokens(sql: str) -> Iterator[tuple[Tok, int, int]]:
    """(kind, start, end) of each token; whitespace is skipped."""
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in _SPACE:
            i += 1
            continue
        if sql.startswith("--", i) or (c == "#" and sql[i + 1 : i + 2] in (" ", "!")):
            # Only "\n" ends a line comment in ClickHouse ("\r" does not).
            end = sql.find("\n", i)
            end = n if end < 0 else end + 1
            kind = Tok.COMMENT
        elif sql.startswith("/*", i):
            end, kind = _block_comment_end(sql, i), Tok.COMMENT
        elif c in "'\"`":
            end, kind = _quoted_end(sql, i), Tok.QUOTED
        elif c == "$" and (heredoc := _HEREDOC.match(sql, i)):
            close = sql.find(heredoc.group(0), heredoc.end())
            if close < 0:
                raise SqlTextError(
                    f"unterminated {heredoc.group(0)} heredoc starting at position {i}"
                )
            end, kind = close + len(heredoc.group(0)), Tok.QUOTED
        elif word := _WORD.match(sql, i):
            end, kind = word.end(), Tok.WORD
        elif c == ";":
            end, kind = i + 1, Tok.SEMICOLON
        else:
            end, kind = i + 1, Tok.OTHER
        yield kind, i, end
        i = end


def quote(identifier: str) -> str:
    """A backquoted identifier (`index`, a column name that is also a keyword, stays a name)."""
    return "`" + identifier.replace("\\", "\\\\").replace("`", "\\`") + "`"


def split_statements(sql: str) -> list[str]:
    """The statements of a script, without their `;`; statements of only comments are dropped."""
    statements: list[str] = []
    first = last = -1
    for kind, start, end in (*sql_tokens(sql), (Tok.SEMICOLON, len(sql), len(sql))):
        if kind is Tok.SEMICOLON:
            if first >= 0:
                statements.append(sql[first:last])
            first = last = -1
        elif kind is not Tok.COMMENT:
            first = start if first < 0 else first
            last = end
    return statements


def words(statement: str) -> list[str]:
    """Bare words outside quotes and comments, upper-cased."""
    return [statement[s:e].upper() for kind, s, e in sql_tokens(statement) if kind is Tok.WORD]


JUDGED_KEPT = 1024
"""Texts of up to JUDGED_CHARS whose read_only_problem is remembered: readers (the ui) send
the same few texts again and again, each judged on both sides of the endpoint."""
JUDGED_CHARS = 8192


def read_only_problem(sql: str) -> str | None:
    """Why `sql` is not exactly one read-only statement, or None when it is.

    The leading keyword is judged first, from the first tokens only, so that a write is named
    as such even when what follows it (e.g. an insert's binary data) is not SQL.
    """
    return _judged(sql) if len(sql) <= JUDGED_CHARS else _read_only_problem(sql)


def _read_only_problem(sql: str) -> str | None:
    lead = next(
        (
            sql[s:e]
            for k, s, e in sql_tokens(sql)
            if k not in (Tok.COMMENT, Tok.SEMICOLON) and sql[s:e] != "("
        ),
        "",
    )
    if not lead:
        return "empty query"
    if lead.upper() not in READ_STATEMENTS:
        allowed = ", ".join(READ_STATEMENTS)
        return f"{lead.upper()} statements are refused (read-only access allows {allowed})"
    statements = split_statements(sql)
    if len(statements) > 1:
        return f"{len(statements)} statements in one request; send one statement at a time"
    upper = words(statements[0])
    if ("INTO", "OUTFILE") in pairwise(upper):
        return "SELECT ... INTO OUTFILE writes a file, which read-only access refuses"
    return None


_judged = functools.lru_cache(maxsize=JUDGED_KEPT)(_read_only_problem)


def trailing_format(statement: str) -> str | None:
    """The name in a trailing `FORMAT name` clause, if the statement ends with one."""
    significant = [statement[s:e] for k, s, e in sql_tokens(statement) if k is not Tok.COMMENT]
    if (
        len(significant) >= 2
        and significant[-2].upper() == "FORMAT"
        and _WORD.fullmatch(significant[-1])
    ):
        return significant[-1]
    return None
