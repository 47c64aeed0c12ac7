"""Find the SQL files and load them by name.

The SQL lives in `sql/` at the top of the source tree and is shipped inside
the wheel as `pgqctl/sql/`. Runtime queries sit in `sql/queries/X.sql`, the
SQL of the library module `pgqctl/X.py` (or package `pgqctl/X/`), as named
blocks, each name unique across the files::

    -- name: job_claim
    UPDATE jobs ...;

Nothing here builds SQL from strings: a block is used as written, with
psycopg placeholders for every value.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pgqctl.errors import PgqctlError

if TYPE_CHECKING:
    from pathlib import Path

_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
# Spaces only readers need: after a comma, around an equals sign (no other
# operator: `a - -b` without its spaces would begin a comment).
_SPARE_SPACES = re.compile(r",[ \t]+|[ \t]+(=)[ \t]+")
_MIGRATION_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@functools.cache
def sql_dir() -> Path:
    """The directory holding migrations/ and queries/."""
    from pathlib import Path  # not at start-up: `pgqctl --help` needs no SQL

    here = Path(__file__).resolve().parent
    for candidate in (here / "sql", here.parent / "sql"):
        if (candidate / "queries").is_dir():
            return candidate
    raise PgqctlError("pgqctl's SQL files are missing: reinstall pgqctl")


@functools.cache
def queries() -> dict[str, str]:
    """Every named block of sql/queries/*.sql, by name."""
    return blocks_in(sorted((sql_dir() / "queries").glob("*.sql")))


def blocks_in(files: list[Path]) -> dict[str, str]:
    """The named blocks of `files`; a name given twice is an error, so that
    no file's block silently takes another's place."""
    blocks: dict[str, str] = {}
    found_in: dict[str, str] = {}
    for path in files:
        parts = _NAME_LINE.split(path.read_text(encoding="utf-8"))
        # parts = [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in found_in:
                raise PgqctlError(
                    f"SQL block {name!r} is named in both {found_in[name]} and {path.name}"
                )
            found_in[name] = path.name
            # Without its closing semicolon: one statement is sent, as it
            # reads in pg_stat_activity.
            blocks[name] = _without_comment_lines(body).strip().removesuffix(";").rstrip()
    return blocks


def _without_comment_lines(body: str) -> str:
    """The block without its whole-line comments, its indentation and the
    spaces after its commas and around its equals signs: they are for
    readers, the shorter text is cheaper to send, and psycopg caches its
    parse of a query only up to 4 kB (no block has a string literal that
    spans lines, whose spaces this would change; literals keep theirs)."""
    lines = (line.strip() for line in body.splitlines())
    text = "\n".join(line for line in lines if line and not line.startswith("--"))
    # Between quotes (the odd pieces) is a literal; '' inside one splits it
    # into two odd pieces around an empty even one, which is left as it is.
    pieces = text.split("'")
    pieces[::2] = [_SPARE_SPACES.sub(lambda m: m.group(1) or ",", piece) for piece in pieces[::2]]
    return "'".join(pieces)


def query(name: str) -> str:
    """The text of one named query."""
    return queries()[name]


# A migration's declarations, comment lines of its file (docs/commands/migrate.md:
# Writing a migration):
#   -- compatibility: additive | breaking
#   -- step: transaction | no transaction [; locks TABLE MODE]... [; reads TABLE]...
_COMPATIBILITY_LINE = re.compile(r"^-- compatibility: *(\S+) *$", re.MULTILINE)
_STEP_LINE = re.compile(r"^-- step: *(.*?) *$", re.MULTILINE)
_LOCK_FIELD = re.compile(r"^locks +(\w+) +([A-Z ]+)$")
_READS_FIELD = re.compile(r"^reads +(\w+)$")
# Table locks a writer (INSERT, UPDATE, DELETE: ROW EXCLUSIVE) waits for.
WRITER_BLOCKING_LOCKS = frozenset({"SHARE", "SHARE ROW EXCLUSIVE", "EXCLUSIVE", "ACCESS EXCLUSIVE"})
_LOCK_MODES = WRITER_BLOCKING_LOCKS | {"SHARE UPDATE EXCLUSIVE"}


@dataclass(frozen=True)
class Step:
    """One part of a migration, run in a transaction of its own (or in none,
    for CREATE INDEX CONCURRENTLY): what it runs and what it declares."""

    text: str
    in_transaction: bool = True
    # (table, lock mode) for every lock it takes on an existing table.
    locks: tuple[tuple[str, str], ...] = ()
    # The existing tables it reads whole (a VALIDATE, an index build).
    reads: tuple[str, ...] = ()
    # False for a file without step lines: what it locks was not said.
    declared: bool = True

    def blocks_writers(self) -> bool:
        return any(mode in WRITER_BLOCKING_LOCKS for _, mode in self.locks)


@dataclass(frozen=True)
class Migration:
    number: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        import hashlib  # here: only `migrate` checks migrations' checksums

        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @property
    def compatibility(self) -> str | None:
        """`additive` (clients that predate it keep working), `breaking`, or
        None when the file does not say (then treated as breaking)."""
        found = _COMPATIBILITY_LINE.search(self.text)
        return found.group(1) if found else None

    @property
    def breaking(self) -> bool:
        return self.compatibility != "additive"

    @functools.cached_property
    def steps(self) -> tuple[Step, ...]:
        """The file cut at its `-- step:` lines; without any, one step in a
        transaction."""
        parts = _STEP_LINE.split(self.text)
        if len(parts) == 1:
            return (Step(self.text, declared=False),)
        # parts = [preamble, declaration1, body1, declaration2, body2, ...]
        return tuple(
            _step(declaration, body, self.name)
            for declaration, body in zip(parts[1::2], parts[2::2], strict=True)
        )


def _step(declaration: str, body: str, name: str) -> Step:
    fields = [field.strip() for field in declaration.split(";")]
    if fields[0] not in ("transaction", "no transaction"):
        raise PgqctlError(f"migration {name}: a step is 'transaction' or 'no transaction'")
    locks: list[tuple[str, str]] = []
    reads: list[str] = []
    for field in fields[1:]:
        lock, read = _LOCK_FIELD.match(field), _READS_FIELD.match(field)
        if lock and lock.group(2) in _LOCK_MODES:
            locks.append((lock.group(1), lock.group(2)))
        elif read:
            reads.append(read.group(1))
        else:
            raise PgqctlError(f"migration {name}: cannot read step field {field!r}")
    return Step(body, fields[0] == "transaction", tuple(locks), tuple(reads))


def migrations() -> list[Migration]:
    """Every migration file, in order. Numbers must be contiguous from 1."""
    found = []
    for path in sorted((sql_dir() / "migrations").glob("*.sql")):
        match = _MIGRATION_FILE.match(path.name)
        if not match:
            raise PgqctlError(f"unexpected migration file name {path.name}: reinstall pgqctl")
        found.append(Migration(int(match.group(1)), path.name, path.read_text(encoding="utf-8")))
    for expected, migration in enumerate(found, start=1):
        if migration.number != expected:
            raise PgqctlError(f"migration {expected:04d} is missing: reinstall pgqctl")
    return found
