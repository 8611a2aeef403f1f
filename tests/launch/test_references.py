"""Nothing outside the repository: every path of the repository that a text file of it names
(code, comments, docs, examples, benchmarks, tests, CI) exists in it, so a reader can follow
each one. A file moved or deleted takes its mentions with it; notes kept elsewhere (a FACTS.md,
a STYLE.md, a DESIGN.md) are not cited; measurements live in docs/benchmarks.md."""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXT = (".py", ".md", ".toml", ".sql", ".sh", ".yaml", ".yml")
"""The files read, and the extensions that make a token with a slash a path to check."""
PACKAGES = ("schemas", "clients", "bus", "environment", "producers", "consumers")
"""Folders installed as rlbus.<name>: `rlbus/bus/x.py` names bus/x.py."""

PATH = re.compile(r"(?<![\w./:@~$%{}<>-])((?:[A-Za-z_.][\w.-]*/)+[\w.-]*\w)")
"""A token with a slash, not inside a URL (after `//` or a host), an email, a variable or a
template, nor the tail of a longer path."""
BARE_NOTE = re.compile(r"(?<![\w./-])([A-Z][A-Z_]*\.md)\b")
"""A bare upper-case note name (README.md, RESULTS.md, FACTS.md): some file of that name must
be in the repository."""
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
"""A markdown link's target, resolved from the linking file's folder."""
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]+$")
"""A segment standing for a name the reader picks (rlbus/commands/NAME.py, PREFIX)."""

ITSELF = "tests/launch/test_references.py"
"""Names missing paths on purpose, as examples of what is flagged."""
CHECKSUMMED = ("bus/store/migrations/", "tests/store/migrations_before_views/")
"""Applied migrations: stores recorded each file's checksum, so their text (comments included)
stays as applied; bus/store/migrate.py refuses any edit it does not list."""

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git checkout"
)


def git(*args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, input=stdin, capture_output=True, text=True, check=False
    ).stdout


@cache
def present() -> tuple[frozenset[str], frozenset[str]]:
    """The repository's files (tracked, and new ones not ignored) that exist now, and every
    folder above them."""
    listed = git("ls-files", "--cached", "--others", "--exclude-standard", "-z").split("\0")
    files = frozenset(f for f in listed if f and (ROOT / f).is_file())
    folders = frozenset(str(p) for f in files for p in PurePosixPath(f).parents if str(p) != ".")
    return files, folders


def exists(path: str) -> bool:
    files, folders = present()
    return path.rstrip("/") in files or path.rstrip("/") in folders


@cache
def top_level() -> frozenset[str]:
    """The names at the repository's root (a path that starts with one is read from there)."""
    files, _ = present()
    return frozenset(f.split("/", 1)[0] for f in files)


def resolves(token: str, source: str) -> bool:
    """Whether `token`, named in `source`, is a path of the repository: from the root, from the
    naming file's folder, as an installed package's path, or (when its first folder is none of
    the root's) as the tail of a path (`commands/worker.py`, `calculator/env.py`)."""
    token = token.rstrip(".")
    here = PurePosixPath(source).parent
    candidates = [token, _normal(here / token)]
    first, _, rest = token.partition("/")
    if first == "rlbus" and rest.split("/", 1)[0] in PACKAGES:
        candidates.append(rest)
    if any(c is not None and exists(c) for c in candidates):
        return True
    if first in top_level() or first in ("..", "."):
        return False
    files, folders = present()
    return any(p.endswith("/" + token) for p in (*files, *folders))


def _normal(path: PurePosixPath) -> str | None:
    """`path` with its `..` and `.` folded; None when it climbs out of the repository."""
    parts: list[str] = []
    for part in path.parts:
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part != ".":
            parts.append(part)
    return "/".join(parts)


def wanted(token: str) -> bool:
    """A token worth checking: a file of one of the TEXT kinds, or anything under one of the
    root's folders; not a placeholder path."""
    segments = token.rstrip(".").split("/")
    if segments[0].startswith(".") and segments[0] not in ("..", ".", *top_level()):
        return False  # `.toml/.py`: extensions, not a folder
    if any(PLACEHOLDER.match(s.split(".", 1)[0]) for s in segments if not s.endswith(".md")):
        return False
    return token.rstrip(".").endswith(TEXT) or segments[0] in top_level()


def ignored(tokens: set[str]) -> set[str]:
    """The tokens .gitignore covers: what runs write (rlbus-data/, bench/out/) and what users
    keep out of git (deploy/.env) are named on purpose and never committed."""
    inside = [t for t in tokens if ".." not in t.split("/")]  # git refuses the whole list else
    asked = [t for token in inside for t in (token, token.rstrip("/") + "/x")]
    said = set(git("check-ignore", "--no-index", "--stdin", stdin="\n".join(asked)).split("\n"))
    return {t for t in tokens if t in said or t.rstrip("/") + "/x" in said}


def missing_in(source: str, text: str) -> list[tuple[int, str]]:
    """(line, path) for each path `text`, the content of `source`, names that is not in the
    repository, ignored ones included."""
    files, _ = present()
    found: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in PATH.finditer(line):
            token = match.group(1)
            if wanted(token) and not resolves(token, source):
                found.append((number, token))
        for match in BARE_NOTE.finditer(line):
            name = match.group(1)
            if not any(f == name or f.endswith("/" + name) for f in files):
                found.append((number, name))
        if source.endswith(".md"):
            for match in LINK.finditer(line):
                target = match.group(1)
                if "://" in target or target.startswith("mailto:"):
                    continue
                if not exists(_normal(PurePosixPath(source).parent / target) or ""):
                    found.append((number, target))
    return found


def dangling() -> list[str]:
    """`file:line: path` for each path named and missing."""
    files, _ = present()
    found = [
        (source, number, token)
        for source in sorted(files)
        if source.endswith(TEXT) and not source.startswith(CHECKSUMMED) and source != ITSELF
        for number, token in missing_in(source, (ROOT / source).read_text(errors="replace"))
    ]
    leave = ignored({token for _, _, token in found})
    return [f"{s}:{n}: {t}" for s, n, t in found if t not in leave]


def test_every_path_the_repository_names_is_in_it() -> None:
    missing = dangling()
    assert not missing, "named but not in the repository:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    ("line", "source", "found"),
    [
        ("see FACTS.md for the figures", "bus/x.py", ["FACTS.md"]),
        ("(STYLE.md: one definition)", "bus/x.py", ["STYLE.md"]),
        ("as DESIGN.md says", "docs/x.md", ["DESIGN.md"]),
        ("checked by tests/test_store_schema.py", "bus/x.py", ["tests/test_store_schema.py"]),
        ("as examples/reverse_text/env.py does", "x.py", ["examples/reverse_text/env.py"]),
        ("bench/nowhere.py prints it", "docs/x.md", ["bench/nowhere.py"]),
        ("[the map](nowhere.md)", "docs/x.md", ["nowhere.md"]),
        ("tests/launch/test_layout.py and docs/architecture.md", "README.md", []),
        ("rlbus/environment/reverse_text.py, commands/worker.py", "docs/x.md", []),
        ("[the map](architecture.md), ../README.md", "docs/x.md", []),
        ("https://github.com/org/repo/blob/main/x/gone.py", "docs/x.md", []),
        ("rlbus/commands/NAME.py; rlbus-data/quickstart/PREFIX/rl.toml", "docs/x.md", []),
        ("weights/v000002.safetensors, models/m", "tests/x.py", []),
    ],
)
def test_what_counts_as_a_missing_path(line: str, source: str, found: list[str]) -> None:
    """The pattern, on lines it must flag and lines it must leave alone."""
    named = [token for _, token in missing_in(source, line)]
    assert [t for t in named if t not in ignored(set(named))] == found
