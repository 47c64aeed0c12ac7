"""Plan, apply and check the schema migrations.

Each migration is recorded in `pgqctl_migration_log` with its checksum once
all its steps ran. A step runs in a transaction of its own (or in none, for
CREATE INDEX CONCURRENTLY), which first takes an advisory lock on the schema,
held until it ends (never left behind, even through a transaction pooler),
and checks again what is applied: four `pgqctl migrate` started at once apply
the schema once and all succeed. Every step can run again.

No step makes writers queue behind it for long: it waits at most
`lock_wait` for its table locks, then rolls back, lets the writers that
queued behind it through, and tries again after a pause. Reading a big table
(a VALIDATE, an index build) takes only locks that writers pass.

Compatibility: each migration says whether clients that predate it keep
working (additive) or not (breaking); the log records, with every migration,
the oldest migration a client must know (`serves_from`), and
`db.require_migrated` applies the rule. pgqctl before the log counted the
rows of `pgqctl_migrations`; that table is left as they left it (so they
keep working) until a breaking migration brings it up to date (then they
refuse, saying to upgrade).
"""

from __future__ import annotations

import datetime as dt
import random
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgqctl.db import atomic
from pgqctl.errors import MigrationError, PrivilegeMissing
from pgqctl.sql import Migration, Step, migrations, query

# First key of the two-key advisory lock; the second is the schema's hash.
_LOCK_KEY = 0x70677163  # "pgqc"
LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout expired

# Checksums of migration files as earlier releases shipped them, before they
# were cut into steps that keep writers going (same schema, other text): a
# schema migrated with that text reads as applied, not changed.
EARLIER_CHECKSUMS = {
    "0001_create_jobs.sql": "32a3f50a0127cb1da1de13efd2076aac48d5ab020764a38c26a0e41bdb85baf3",
    "0002_claim_by_queue_and_kind.sql": (
        "7552cf3f7d8ff0b5f5934db7e8598415ba78ee228a76ba7d714045b3896c5817"
    ),
    "0003_handbacks.sql": "b12a1c7931c84e178718f1136878b15555925fa9074aeb712bcb8a2a206116d2",
    "0004_cancelled.sql": "713e6379a57c6e65db4219ac39725113be6e3d02dc32e20c068f21508df2a7b3",
    "0005_paused_queues.sql": "e3488d866ea21b7ce6ccb8f7c23da801764aa90fd4e5e7d706d51ddd26f91617",
    "0006_unique_key.sql": "fe887b733a4778217eba6c2c0cbf5ee460b08be4a4f449bb6592e016763dca37",
    "0007_workers.sql": "ed79c47dccbc69fcfdc7ba619ae28345ade855e769047b35476f705267162818",
    "0008_schedules.sql": "26519f362cf348b1758ca4c356996e53a821c6811ec1e01ad6d3eb53783f6626",
    "0009_jobs_autovacuum.sql": "2ad1c26ee271998d23dd809c695de8bf357885386a108ea142a0b4e696374662",
    "0010_schedule_sources.sql": (
        "218fa386ebf60a964539b119c74327966b24aab03740bade4a9d5de5eeb3d253"
    ),
}

# Reading a table whole (VALIDATE, one pass of an index build), bytes a
# second: a rough figure measured on 2 cores (bench/migrate_bench.py), for
# the estimates of --dry-run and --status.
SCAN_BYTES_PER_SECOND = 150e6
# An index build CONCURRENTLY reads the table twice (and sorts what it keeps):
# 1,100,000 jobs (117 MB) took 1.0 to 1.6 s an index.
_BUILD_PASSES = 2
_CONCURRENT_INDEX = re.compile(
    r"\bINDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE
)


@dataclass(frozen=True)
class MigrationState:
    name: str
    status: str  # applied, pending or changed
    applied_at: dt.datetime | None


def status(conn: psycopg.Connection[Any], schema: str) -> list[MigrationState]:
    """Every known migration with whether it is applied, pending or changed,
    then any applied by a newer pgqctl ("unknown")."""
    with _snapshot(conn):
        applied = _applied(conn, schema)
        _refuse_foreign_jobs_table(conn, schema, applied)
    states = []
    for m in migrations():
        if m.name not in applied:
            states.append(MigrationState(m.name, "pending", None))
        else:
            checksum, applied_at = applied[m.name]
            state = "applied" if _matches(m, checksum) else "changed"
            states.append(MigrationState(m.name, state, applied_at))
    for name in _unknown(applied):
        states.append(MigrationState(name, "unknown", applied[name][1]))
    return states


def pending(conn: psycopg.Connection[Any], schema: str) -> list[Migration]:
    """Migrations still to apply; refuses when an applied one has changed."""
    # One snapshot for both reads: a migrate committing in between must not make
    # its new jobs table look like one pgqctl did not create.
    with _snapshot(conn):
        return _pending(conn, schema)


def _pending(conn: psycopg.Connection[Any], schema: str) -> list[Migration]:
    applied = _applied(conn, schema)
    _refuse_changed(applied)
    _refuse_newer(applied, schema)
    _refuse_foreign_jobs_table(conn, schema, applied)
    return [m for m in migrations() if m.name not in applied]


@contextmanager
def _snapshot(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """A transaction whose reads all see one snapshot (REPEATABLE READ)."""
    level = conn.isolation_level
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    try:
        with conn.transaction():
            yield
    finally:
        conn.isolation_level = level


@dataclass(frozen=True)
class Waiting:
    """A step that could not take its locks in time and will try again."""

    migration: str
    step: int
    retry_in: float


def apply(
    conn: psycopg.Connection[Any],
    schema: str,
    on_applied: Callable[[Migration], None] | None = None,
    *,
    lock_wait: float = 0.5,
    retry_for: float = 600.0,
    on_waiting: Callable[[Waiting], None] | None = None,
) -> list[Migration]:
    """Apply what is pending, step by step (see the module's doc).

    A step waits at most `lock_wait` seconds for a table lock, then tries
    again after a pause that grows, for `retry_for` seconds in all."""
    done: list[Migration] = []
    while True:
        with conn.transaction():  # READ COMMITTED: each read sees what committed before it
            _lock_schema(conn, schema)
            todo = _pending(conn, schema)
            if not todo:
                return done
            _create_bookkeeping(conn, schema)
        migration = todo[0]
        locks = _LockRetry(migration, lock_wait, retry_for, on_waiting)
        if _apply_steps(migration, locks, conn, schema):
            done.append(migration)
            if on_applied:
                on_applied(migration)


def _apply_steps(
    migration: Migration, locks: _LockRetry, conn: psycopg.Connection[Any], schema: str
) -> bool:
    """Run every step and record the migration; False if another run
    applied it meanwhile."""
    for number, step in enumerate(migration.steps, start=1):
        if locks.run(number, conn, schema, step):
            return False
    if not migration.steps[-1].in_transaction:
        # Recorded in a transaction of its own.
        return not locks.run(len(migration.steps), conn, schema, None)
    return True


class _LockRetry:
    """Runs a step until it gets its locks, pausing between tries."""

    def __init__(
        self,
        migration: Migration,
        lock_wait: float,
        retry_for: float,
        on_waiting: Callable[[Waiting], None] | None,
    ) -> None:
        self.migration = migration
        self.lock_wait = lock_wait
        self.deadline = time.monotonic() + retry_for
        self.on_waiting = on_waiting

    def run(
        self, number: int, conn: psycopg.Connection[Any], schema: str, step: Step | None
    ) -> bool:
        """Run a step (see `_run_in_transaction`, `_run_outside_transaction`).

        A deadlock is retried too: concurrent runs of one migration can meet
        in one (a run's step waits for the index build of another, which
        waits for that step's transaction to end)."""
        timeout = f"{max(1, round(self.lock_wait * 1000))}ms"
        pause = self.lock_wait
        while True:
            try:
                if step is not None and not step.in_transaction:
                    return _run_outside_transaction(conn, schema, self.migration, step)
                return _run_in_transaction(conn, schema, self.migration, step, timeout)
            except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
                if time.monotonic() + pause > self.deadline:
                    raise MigrationError(
                        f"migration {self.migration.name} (step {number}) could not take "
                        "its table locks: other sessions held them at every try; find "
                        "them in pg_locks (`pgqctl doctor`), then run migrate again, or "
                        "give it longer with --retry-for"
                    ) from exc
            # Jittered, so that concurrent runs do not retry in step.
            wait = pause * random.uniform(0.5, 1.0)
            if self.on_waiting:
                self.on_waiting(Waiting(self.migration.name, number, wait))
            time.sleep(wait)
            pause = min(pause * 2, 30.0)


def _lock_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(query("migrate_lock"), {"key": _LOCK_KEY, "schema": schema})


def _run_in_transaction(
    conn: psycopg.Connection[Any],
    schema: str,
    migration: Migration,
    step: Step | None,
    lock_timeout: str,
) -> bool:
    """Run one step (and record the migration after its last step, or when
    `step` is None); True if another run had applied the migration."""
    last = step is None or step is migration.steps[-1]
    with conn.transaction():
        _lock_schema(conn, schema)
        if migration.name in _applied(conn, schema):
            return True
        conn.execute(query("migration_lock_timeout"), {"timeout": lock_timeout})
        if step is not None:
            conn.execute(step.text.encode("utf-8"))
        if last:
            _record(conn, migration)
    return False


def _run_outside_transaction(
    conn: psycopg.Connection[Any], schema: str, migration: Migration, step: Step
) -> bool:
    """Run a step that cannot run in a transaction (CREATE INDEX
    CONCURRENTLY), leaving the indexes it names valid; True if another run
    had applied the migration."""
    with conn.transaction():
        if migration.name in _applied(conn, schema):
            return True
    statement = outside_statement(step.text, schema)
    names = _CONCURRENT_INDEX.findall(step.text)
    _drop_failed_builds(conn, schema, names)
    while True:
        try:
            # Another run may have started the same build a moment before: it goes on.
            with suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                conn.execute(statement)
        except psycopg.errors.InternalError_ as exc:
            # Another run's build on the same table updated the table's
            # catalog row at the same moment ("tuple concurrently updated"):
            # once the builds under way end, try again.
            if "tuple concurrently updated" not in str(exc):
                raise
            _drop_failed_builds(conn, schema, names)
            continue
        if not _drop_failed_builds(conn, schema, names):
            return False


# The statements a step outside a transaction may run, with the name to
# qualify: no transaction means no transaction-local search_path.
_OUTSIDE_STATEMENTS = [
    re.compile(
        r"(CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?\w+\s+ON\s+)"
        r"(\w+)(\s[^;]*;?\s*)",
        re.IGNORECASE | re.DOTALL,
    ),
    re.compile(
        r"(DROP\s+INDEX\s+CONCURRENTLY\s+(?:IF\s+EXISTS\s+)?)(\w+)(\s*;?\s*)",
        re.IGNORECASE | re.DOTALL,
    ),
]


def outside_statement(text: str, schema: str) -> sql.Composed:
    """A step's CREATE INDEX CONCURRENTLY (or DROP INDEX CONCURRENTLY) with
    its table (or index) qualified by the schema."""
    lines = [line for line in text.strip().splitlines() if not line.startswith("--")]
    statement = "\n".join(lines).strip()
    for pattern in _OUTSIDE_STATEMENTS:
        found = pattern.fullmatch(statement)
        if found:
            before, name, after = found.groups()
            return sql.Composed([sql.SQL(before), sql.Identifier(schema, name), sql.SQL(after)])
    raise MigrationError(
        "a migration step outside a transaction may only be one CREATE INDEX "
        f"CONCURRENTLY or DROP INDEX CONCURRENTLY, not: {statement[:60]!r}: reinstall pgqctl"
    )


def _drop_failed_builds(conn: psycopg.Connection[Any], schema: str, names: list[str]) -> bool:
    """Wait for the builds of these indexes that other sessions run, then
    drop those left invalid (a build that failed or was interrupted), which
    the step's IF NOT EXISTS would otherwise keep; True if any was dropped."""
    if not names:
        return False
    while True:
        with conn.transaction():
            rows = conn.execute(
                query("migration_indexes"), {"schema": schema, "names": names}
            ).fetchall()
        if not any(building for _, _, building in rows):
            break
        time.sleep(0.2)
    invalid = [name for name, valid, _ in rows if not valid]
    for name in invalid:
        conn.execute(
            sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}.{}").format(
                sql.Identifier(schema), sql.Identifier(name)
            )
        )
    return bool(invalid)


def _record(conn: psycopg.Connection[Any], migration: Migration) -> None:
    params = {
        "name": migration.name,
        "checksum": migration.checksum,
        "breaking": migration.breaking,
    }
    conn.execute(query("migration_record"), params)
    if migration.number == 1:
        # The queue is new: pgqctl before the log reads it as its first migration.
        conn.execute(query("migrations_create"))
        conn.execute(query("migration_record_legacy"), params)
    if migration.breaking:
        conn.execute(query("migration_legacy_catch_up"))


def _matches(migration: Migration, checksum: str) -> bool:
    return checksum in (migration.checksum, EARLIER_CHECKSUMS.get(migration.name))


def _applied(conn: psycopg.Connection[Any], schema: str) -> dict[str, tuple[str, dt.datetime]]:
    with atomic(conn):
        params = {"schema": schema}
        if conn.execute(query("migration_log_exists"), params).fetchone():
            rows = conn.execute(query("migration_log_applied")).fetchall()
            return {name: (checksum, applied_at) for name, checksum, applied_at in rows}
        found = conn.execute(query("migrations_table_exists"), params).fetchone()
        if not found:
            return {}
        readable, role = found
        if not readable:
            # Its columns would look missing, as if another program made it.
            name = sql.Identifier(schema, "pgqctl_migrations").as_string(None)
            raise PrivilegeMissing(
                f"role {role} may not read {name}, which the queue's migrations are kept in: "
                f"run migrate as the role that owns the queue's tables, or have it run "
                f"`GRANT SELECT ON {name} TO {sql.Identifier(role).as_string(None)}`"
            )
        columns = {row[0] for row in conn.execute(query("migrations_table_columns"), params)}
        if not {"name", "checksum", "applied_at"} <= columns:
            raise MigrationError(
                f"schema {schema} has a pgqctl_migrations table that pgqctl did not create; "
                "left it untouched: use --schema to put the queue in another schema"
            )
        rows = conn.execute(query("migrations_applied")).fetchall()
    return {name: (checksum, applied_at) for name, checksum, applied_at in rows}


def _refuse_changed(applied: dict[str, tuple[str, dt.datetime]]) -> None:
    for m in migrations():
        if m.name in applied and not _matches(m, applied[m.name][0]):
            raise MigrationError(
                f"migration {m.name} was applied but its file has changed since: "
                "restore the original file (migrations are forward-only; add a new one)"
            )


def _unknown(applied: dict[str, tuple[str, dt.datetime]]) -> list[str]:
    """Applied migrations this pgqctl has no file for: a newer one applied them."""
    return sorted(set(applied) - {m.name for m in migrations()})


def _refuse_newer(applied: dict[str, tuple[str, dt.datetime]], schema: str) -> None:
    unknown = _unknown(applied)
    if unknown:
        raise MigrationError(
            f"schema {schema} was migrated by a newer pgqctl ({', '.join(unknown)} "
            "applied, unknown to this one): upgrade pgqctl"
        )


def _refuse_foreign_jobs_table(
    conn: psycopg.Connection[Any], schema: str, applied: dict[str, tuple[str, dt.datetime]]
) -> None:
    if applied:
        return
    # Any relation of that name would collide: a table, a view, a sequence...
    with atomic(conn):
        row = conn.execute(query("jobs_relation_kind"), {"schema": schema}).fetchone()
    if row:
        what = _RELATION_KINDS.get(row[0], "relation")
        raise MigrationError(
            f"schema {schema} already has a {what} named jobs that pgqctl did not create; "
            "left it untouched: use --schema to put the queue in another schema"
        )


_RELATION_KINDS = {
    "r": "table",
    "p": "table",
    "v": "view",
    "m": "materialized view",
    "f": "foreign table",
    "S": "sequence",
    "i": "index",
    "I": "index",
    "c": "type",
}


def _create_bookkeeping(conn: psycopg.Connection[Any], schema: str) -> None:
    """The schema and the bookkeeping table, in the migration's transaction."""
    if not conn.execute(query("schema_exists"), {"schema": schema}).fetchone():
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    if not conn.execute(query("migration_log_exists"), {"schema": schema}).fetchone():
        conn.execute(query("migration_log_create"))
        if conn.execute(query("migrations_table_exists"), {"schema": schema}).fetchone():
            conn.execute(query("migration_log_take_over"), {"first": migrations()[0].name})


@dataclass(frozen=True)
class Impact:
    """What applying a migration does to the tables it touches: the locks it
    takes, whether writers wait, and what it reads whole, with an estimate
    of the time from the tables' size."""

    name: str
    steps: int
    locks: list[str]  # "jobs ACCESS EXCLUSIVE", ...; empty: new objects only
    declared: bool
    writers_wait: bool  # for a moment, at most the lock wait per try
    read_bytes: int
    read_rows: int
    estimate_seconds: float


def impacts(conn: psycopg.Connection[Any], schema: str, todo: list[Migration]) -> list[Impact]:
    """The Impact of each migration of `todo`, from the tables' size now."""
    steps = [step for m in todo for step in m.steps]
    tables = sorted({table for step in steps for table in step.reads})
    sizes: dict[str, tuple[int, int]] = {}
    if tables:
        with atomic(conn):
            rows = conn.execute(
                query("migration_table_sizes"), {"schema": schema, "names": tables}
            ).fetchall()
        sizes = {name: (size, count) for name, size, count in rows}
    return [_impact(m, sizes) for m in todo]


def _impact(migration: Migration, sizes: dict[str, tuple[int, int]]) -> Impact:
    locks: list[str] = []
    seconds = 0.0
    for step in migration.steps:
        locks += [f"{table} {mode}" for table, mode in step.locks]
        for table in step.reads:
            passes = len(_CONCURRENT_INDEX.findall(step.text)) * _BUILD_PASSES or 1
            seconds += passes * sizes.get(table, (0, 0))[0] / SCAN_BYTES_PER_SECOND
    read = {table for step in migration.steps for table in step.reads}
    read_bytes = sum(sizes.get(table, (0, 0))[0] for table in read)
    read_rows = sum(sizes.get(table, (0, 0))[1] for table in read)
    return Impact(
        name=migration.name,
        steps=len(migration.steps),
        locks=list(dict.fromkeys(locks)),
        declared=all(step.declared for step in migration.steps),
        writers_wait=any(step.blocks_writers() for step in migration.steps),
        read_bytes=read_bytes,
        read_rows=read_rows,
        estimate_seconds=round(seconds, 1),
    )
