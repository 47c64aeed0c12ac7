"""Steering the queue: pause, resume (library: pgqctl/control.py)."""

from __future__ import annotations

import click

from pgqctl import control
from pgqctl.commands.options import (
    AGE,
    Database,
    command,
    database_options,
    format_options,
    say,
    selection_option,
)
from pgqctl.output.control import emit_pauses
from pgqctl.text import format_seconds, plural

PAUSED_FIELDS = (*control.PAUSE_FIELDS, "updated")


@command("pause")
@database_options
@click.argument("queues", metavar="QUEUE...", nargs=-1, required=True)
@selection_option(
    "--for",
    "seconds",
    type=AGE,
    metavar="DURATION",
    help="End the pause by itself after this long, with a unit (ms, s, m, h, d, w), "
    "e.g. 30m. Default: until `pgqctl resume`.",
)
@selection_option("--reason", metavar="TEXT", help="Why, for `stats` and whoever looks.")
@selection_option(
    "--force",
    is_flag=True,
    help="Pause a queue that has never had a job nor a pause (else refused as a likely typo).",
)
@format_options
def pause_command(
    database: Database,
    queues: tuple[str, ...],
    seconds: float | None,
    reason: str | None,
    force: bool,
    fmt: str,
) -> None:
    """Stop workers claiming jobs from these queues, until resumed or for a while.

    Kept in the database: every worker, on any host, claims nothing more
    from a paused queue from its next claim on, workers started later too,
    and a queue with no jobs yet can be paused. Jobs already running go on,
    and jobs can still be enqueued; they wait. A pause --for a duration ends
    by itself: workers take the queue's jobs again when it ends.

    Pausing a paused queue again sets when it ends (without --for: when
    resumed) and, when --reason is given, its reason.

    A queue pgqctl does not know (no pending or running job, no pause, no
    schedule, and not in the table's statistics) is refused as a likely
    typo, with the known name closest to it; --force pauses it anyway, for a
    queue whose first jobs are still to come.

    \b
    Example:
        pgqctl pause emails --reason 'smtp provider down'
        pgqctl pause emails sms --for 30m
        pgqctl pause reports --json
        pgqctl pause new-imports --force
    """
    with database.connect(writes=True) as conn:
        done = control.pause(conn, queues, seconds=seconds, reason=reason, force=force)
    emit_pauses(done, fmt, PAUSED_FIELDS)
    for paused in done:
        if paused.updated:
            say(f"queue {paused.pause.queue} was paused already: its pause is updated")
    until = (
        "until resumed (`pgqctl resume`)" if seconds is None else f"for {format_seconds(seconds)}"
    )
    names = ", ".join(p.pause.queue for p in done)
    say(
        f"paused {plural(len(done), 'queue')} ({names}) {until}: "
        "workers claim nothing more from them; running jobs go on"
    )


@command("resume")
@database_options
@click.argument("queues", metavar="QUEUE...", nargs=-1, required=True)
@format_options
def resume_command(database: Database, queues: tuple[str, ...], fmt: str) -> None:
    """Let workers claim from paused queues again, at once.

    Prints the pauses that ended. A queue that is not paused (or whose
    pause --for has ended already) is left as it is, and said so.

    \b
    Example:
        pgqctl resume emails
        pgqctl resume emails sms --json
    """
    with database.connect(writes=True) as conn:
        result = control.resume(conn, queues)
    emit_pauses(result.resumed, fmt, control.PAUSE_FIELDS)
    for name in result.not_paused:
        say(f"queue {name} is not paused: nothing to do")
    if result.resumed:
        names = ", ".join(p.queue for p in result.resumed)
        say(
            f"resumed {plural(len(result.resumed), 'queue')} ({names}): "
            "workers claim from them again"
        )
