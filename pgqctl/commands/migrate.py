"""`pgqctl migrate`: create or upgrade the queue schema (library: pgqctl/migrate.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from pgqctl import db
from pgqctl.commands.options import (
    DURATION,
    Database,
    command,
    database_options,
    format_options,
    say,
    selection_option,
)
from pgqctl.errors import CheckFailed
from pgqctl.output.formats import emit_rows
from pgqctl.sql import migrations
from pgqctl.text import size

if TYPE_CHECKING:
    from pgqctl.migrate import Impact, MigrationState


IMPACT_COLUMNS = ["locks", "writers", "reads", "estimate"]
# --status, --check and --dry-run only read: seconds they wait for a lock
# when no --lock-timeout is given, as every other command.
READ_LOCK_TIMEOUT = 5.0


@command("migrate")
# No statement limit: a migration may rewrite or validate a big table. No
# lock limit for the whole run either: a migrate waits for another one to
# finish (the advisory lock), and each step bounds its own table locks with
# --lock-wait, giving way to writers and trying again.
@database_options(lock_timeout="0", statement_timeout="0")
@selection_option(
    "--dry-run",
    is_flag=True,
    help="List what would be applied, with the locks each migration takes, on which "
    "tables, and how long its reads of big tables should last; change nothing.",
)
@selection_option("--check", is_flag=True, help="Exit 3 if any migration is pending, else 0.")
@selection_option(
    "--status",
    "show_status",
    is_flag=True,
    help="List applied and pending migrations (pending ones with what --dry-run says).",
)
@click.option(
    "--lock-wait",
    type=DURATION,
    default="500ms",
    show_default=True,
    help="How long a step waits for a table lock before it gives way to the writers "
    "queued behind it and tries again later, e.g. --lock-wait 2s.",
)
@click.option(
    "--retry-for",
    type=DURATION,
    default="10m",
    show_default=True,
    help="How long to keep trying a step whose locks other sessions hold, e.g. --retry-for 1h.",
)
@format_options
def migrate_command(
    database: Database,
    dry_run: bool,
    check: bool,
    show_status: bool,
    lock_wait: float,
    retry_for: float,
    fmt: str,
) -> None:
    """Create or upgrade the queue schema.

    Each step of a migration runs in its own transaction under an advisory
    lock, so concurrent runs are safe; re-running is a no-op. Workers and
    producers keep running: no step makes writers wait longer than
    --lock-wait, and big tables are read without holding writers off.

    \b
    Example:
        pgqctl migrate
        pgqctl migrate --check || echo "schema out of date"
        pgqctl migrate --dry-run
        pgqctl --debug migrate --schema jobs_staging --status
    """
    from pgqctl import migrate

    writes = not (show_status or check or dry_run)
    if not writes and not database.timeouts.lock:
        # Reading what is applied and how big the tables are waits on a
        # table lock like any read (pg_table_size): as any command, give up
        # after the default and name the holder. Applying keeps no limit of
        # its own (each step waits --lock-wait, and the schema's lock waits
        # for another migrate).
        database.timeouts = replace(database.timeouts, lock=READ_LOCK_TIMEOUT)
    with database.connect(migrated=False, writes=writes) as conn:
        if show_status:
            states = migrate.status(conn, database.schema)
            todo = [m for m in migrations() if m.name in _pending_names(states)]
            impacts = {i.name: _impact_row(i) for i in migrate.impacts(conn, database.schema, todo)}
            rows = [
                {
                    "name": s.name,
                    "status": s.status,
                    "applied_at": s.applied_at,
                    **impacts.get(s.name, dict.fromkeys(IMPACT_COLUMNS)),
                }
                for s in states
            ]
            emit_rows(rows, ["name", "status", "applied_at", *IMPACT_COLUMNS], fmt)
            return
        if check:
            todo = migrate.pending(conn, database.schema)
            if todo:
                raise CheckFailed(
                    f"{len(todo)} migration(s) pending in schema {database.schema}: "
                    f"run `{db.migrate_command(database.schema)}`"
                )
            say(f"schema {database.schema} is up to date")
            return
        if dry_run:
            todo = migrate.pending(conn, database.schema)
            planned = migrate.impacts(conn, database.schema, todo)
            rows = [{"name": i.name, **_impact_row(i)} for i in planned]
            emit_rows(rows, ["name", *IMPACT_COLUMNS], fmt)
            say(f"{len(todo)} migration(s) would be applied" if todo else "nothing to do")
            return
        applied = migrate.apply(
            conn,
            database.schema,
            on_applied=lambda m: say(f"applied {m.name}"),
            lock_wait=lock_wait,
            retry_for=retry_for,
            on_waiting=lambda w: say(
                f"{w.migration} (step {w.step}): its tables are locked by other sessions; "
                f"let writers by, trying again in {w.retry_in:.1f}s"
            ),
        )
        if not applied:
            say(f"nothing to do: schema {database.schema} is up to date")


def _pending_names(states: list[MigrationState]) -> set[str]:
    return {s.name for s in states if s.status == "pending"}


def _impact_row(impact: Impact) -> dict[str, Any]:
    """What a migration does to the tables, as the columns of a listing."""
    if not impact.declared:
        locks, writers = "not declared", "unknown"
    else:
        locks = ", ".join(impact.locks) or "none (new objects only)"
        writers = "wait a moment" if impact.writers_wait else "go on"
    reads = f"{size(impact.read_bytes)}, ~{impact.read_rows:,} rows" if impact.read_bytes else ""
    return {
        "locks": locks,
        "writers": writers,
        "reads": reads,
        "estimate": f"~{impact.estimate_seconds:g}s" if impact.read_bytes else "a moment",
    }
