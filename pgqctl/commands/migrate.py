"""`pgqctl migrate`: create or upgrade the queue schema (library: pgqctl/migrate.py)."""

from __future__ import annotations

import click

from pgqctl import db, output
from pgqctl.commands.options import (
    Database,
    command,
    database_options,
    format_options,
    say,
    selection_option,
)
from pgqctl.errors import CheckFailed


@command("migrate")
# No statement limit: a migration may rewrite or validate a big table.
@database_options(statement_timeout="0")
@selection_option("--dry-run", is_flag=True, help="List what would be applied; change nothing.")
@selection_option("--check", is_flag=True, help="Exit 3 if any migration is pending, else 0.")
@selection_option(
    "--status", "show_status", is_flag=True, help="List applied and pending migrations."
)
@format_options
def migrate_command(
    database: Database, dry_run: bool, check: bool, show_status: bool, fmt: str
) -> None:
    """Create or upgrade the queue schema.

    Each migration runs in its own transaction under an advisory lock, so
    concurrent runs are safe; re-running is a no-op.

    \b
    Example:
        pgqctl migrate
        pgqctl migrate --check || echo "schema out of date"
        pgqctl --debug migrate --schema jobs_staging --status
    """
    from pgqctl import migrate

    writes = not (show_status or check or dry_run)
    with database.connect(migrated=False, writes=writes) as conn:
        if show_status:
            states = migrate.status(conn, database.schema)
            rows = [
                {"name": s.name, "status": s.status, "applied_at": s.applied_at} for s in states
            ]
            output.emit_rows(rows, ["name", "status", "applied_at"], fmt)
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
            for m in todo:
                click.echo(m.name)
            say(f"{len(todo)} migration(s) would be applied" if todo else "nothing to do")
            return
        applied = migrate.apply(
            conn, database.schema, on_applied=lambda m: say(f"applied {m.name}")
        )
        if not applied:
            say(f"nothing to do: schema {database.schema} is up to date")
