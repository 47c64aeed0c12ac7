"""`pgqctl failures` (library: pgqctl/failures.py)."""

from __future__ import annotations

import click

from pgqctl.commands.options import (
    AGE,
    Database,
    command,
    database_options,
    format_options,
    kind_filter,
    queue_filter,
    say,
    selection_option,
)
from pgqctl.failures import failures
from pgqctl.output.failures import emit_failures


@command("failures")
@database_options
@queue_filter
@kind_filter
@selection_option(
    "--since",
    type=AGE,
    metavar="DURATION",
    help="Only jobs that failed within this long, with a unit (ms, s, m, h, d, w), e.g. 1d.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=0, max=2**31 - 1),
    default=20,
    show_default=True,
    help="At most this many causes, the most frequent first; 0: every one.",
)
@format_options
def failures_command(
    database: Database,
    queues: tuple[str, ...],
    kinds: tuple[str, ...],
    since: float | None,
    limit: int,
    fmt: str,
) -> None:
    """Failed jobs grouped by kind and cause, the most frequent first.

    A job's cause is what `list` shows of its failure: the first line of its
    last_error and, after a worker's "exit status 1" (a signal, a timeout),
    the last line its program wrote. Numbers in a cause count as one (an
    exit status and a signal number excepted), so "invoice 1187 has no
    customer" and "invoice 2204 has no customer" are one cause. Each row
    gives how many jobs, the first and last time one failed, and the id of
    the one that failed last, whose cause is shown. Failed means failed for
    good (out of attempts, or never runnable): `pgqctl requeue --error TEXT`
    runs a cause's jobs again once it is fixed.

    \b
    Example:
        pgqctl failures
        pgqctl failures --since 1d --kind send_receipt
        pgqctl failures --json | jq '.[0].example_id'
    """
    with database.connect() as conn:
        found = failures(conn, queues=queues, kinds=kinds, since=since, limit=limit or None)
    for line in emit_failures(found, fmt):
        say(line)
