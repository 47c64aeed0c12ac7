"""Diagnosing: doctor, why the queue is slow (library: pgqctl/doctor.py)."""

from __future__ import annotations

import click

from pgqctl import doctor
from pgqctl.commands.options import AGE, Database, command, database_options, format_options, say
from pgqctl.errors import EXIT_CHECK
from pgqctl.output.doctor import emit_doctor
from pgqctl.output.formats import is_human
from pgqctl.text import plural


@command("doctor")
@database_options
@click.option(
    "--max-horizon-age",
    type=AGE,
    metavar="DURATION",
    default="5m",
    show_default=True,
    help="A transaction or prepared transaction holding the xmin horizon longer than "
    "this, while it keeps dead tuples of the queue's tables from vacuum, is a finding.",
)
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="Also each table's vacuum and analyze counters, settings and indexes.",
)
@format_options
def doctor_command(database: Database, max_horizon_age: float, verbose: bool, fmt: str) -> None:
    """Why the queue is slow: vacuum, bloat and the xmin horizon of the
    queue's tables, with what to do and the SQL that does it.

    The findings come first, each with what to do. Then whatever holds
    back the xmin horizon, so that vacuum cannot remove dead
    tuples: the oldest transactions (pid, user, application, client, state,
    age, query start), prepared transactions, replication slots and
    standbys with hot_standby_feedback, with how many dead tuples each keeps.
    Then autovacuum: jobs's own settings (those `migrate` gives, vacuuming
    after a fixed number of rows), whether the churn outruns them, whether
    its workers are all busy, and whether jobs waits too long for one.
    Last, one line per table of pgqctl's: live and dead tuples, table and
    index sizes and bloat (exact with the pgstattuple extension, which reads
    each table whole; estimated from the statistics otherwise); --verbose
    adds the last vacuum, autovacuum, analyze and autoanalyze with their
    counts, the table's settings and each index.

    Each finding comes with a recommendation and the SQL to act on it
    (SELECT pg_terminate_backend(...), ROLLBACK PREPARED ..., VACUUM ...),
    printed, never run. Exit 0 when nothing needs doing, 3 when something
    does, 1 when the queue cannot be looked at. --json has every figure.
    As a pg_monitor member it sees what it needs; with less, it says on
    stderr what it could not see.

    \b
    Example:
        pgqctl doctor
        pgqctl doctor --max-horizon-age 1m
        pgqctl doctor --verbose
        pgqctl doctor --json | jq '.findings[].sql[]'
    """
    with database.connect() as conn:
        report = doctor.diagnose(conn, max_horizon_age=max_horizon_age)
    emit_doctor(report, fmt, verbose=verbose)
    for what in report.unseen:
        say(f"could not see {what}")
    if is_human(fmt):
        for note in report.notes:
            say(f"note: {note}")
    if report.findings:
        say(f"{plural(len(report.findings), 'finding')}: see the SQL at the top to act")
        raise click.exceptions.Exit(EXIT_CHECK)
    say("ok: nothing needs doing")
