"""`pgqctl why ID` (library: pgqctl/why.py)."""

from __future__ import annotations

import click

from pgqctl import why
from pgqctl.commands.options import JOB_ID, Database, command, database_options, format_options
from pgqctl.errors import NotFound
from pgqctl.output.why import emit_why


@command("why")
@database_options
@click.argument("job_id", metavar="ID", type=JOB_ID)
@format_options
def why_command(database: Database, job_id: int, fmt: str) -> None:
    """Why a job is not running, each reason with the command that would
    change it.

    Read from what the database holds, in one snapshot: not due yet (and
    whether it waits to retry), its queue paused, no active worker taking
    its queue and kind, due jobs of its queue ahead of it, every slot of the
    workers that take it busy (as of their last heartbeat); for a running
    job, the worker that holds it and whether it is alive; for a finished
    one, how it ended.

    \b
    Example:
        pgqctl why 4711
        pgqctl why 4711 --json | jq -r '.reasons[].code'
    """
    with database.connect() as conn:
        found = why.why(conn, job_id)
    if found is None:
        raise NotFound(
            f"job {job_id} not found in schema {database.schema}: "
            "`pgqctl list` shows the jobs there"
        )
    emit_why(found, fmt)
