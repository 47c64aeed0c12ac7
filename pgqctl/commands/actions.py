"""actions: what was done to the queue from the web page (library: pgqctl/actions.py)."""

from __future__ import annotations

import click

from pgqctl import actions
from pgqctl.commands.options import (
    AGE,
    COUNT,
    Database,
    command,
    database_options,
    format_options,
    say,
)
from pgqctl.output.formats import emit_rows, is_human

COLUMNS = ["at", "actor", "action", "target", "changed"]


@command("actions")
@database_options
@click.option(
    "--since",
    type=AGE,
    metavar="DURATION",
    help="Only actions within this long, with a unit (ms, s, m, h, d, w), e.g. 1d.",
)
@click.option(
    "--limit",
    type=COUNT,
    default=100,
    show_default=True,
    help="At most this many, the newest.",
)
@format_options
def actions_command(database: Database, since: float | None, limit: int, fmt: str) -> None:
    """What operators did to the queue from the web page: when, who, what,
    on which jobs, and how many.

    Newest first, as `pgqctl web --allow-actions` recorded them: who is the
    name given to the page's authentication and the address it came from;
    what is retry, run_now, cancel, pause, resume, requeue_matching or
    cancel_matching, on a job, a queue or the filter the jobs matched. An
    action on the jobs a filter matches that stopped before its end says so.

    \b
    Example:
        pgqctl actions --since 1d
        pgqctl actions --json
    """
    with database.connect() as conn:
        found = actions.recent(conn, since=since, limit=limit)
    if is_human(fmt):
        emit_rows(
            [
                {
                    "at": a.at,
                    "actor": a.actor,
                    "action": a.action + ("" if a.finished else " (stopped before its end)"),
                    "target": actions.target_text(a.target),
                    "changed": a.jobs,
                }
                for a in found
            ],
            COLUMNS,
            fmt,
        )
    else:
        emit_rows([a.as_record() for a in found], actions.FIELDS, fmt)
    if not found and since is not None:
        say("no actions within that time: leave out --since to see the older ones")
    elif not found:
        say("no actions recorded: `pgqctl web --allow-actions` records what is done there")
