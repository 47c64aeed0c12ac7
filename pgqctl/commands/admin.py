"""The operator's commands: stats, leases, list, show, reap, requeue, cancel,
purge (library: pgqctl/admin.py)."""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from pgqctl import admin, attempts, control, history, leases
from pgqctl.commands.ctrl_c import CtrlC
from pgqctl.commands.options import (
    AGE,
    COUNT,
    DURATION,
    DURATION_OR_AUTO,
    JOB_ID,
    Database,
    command,
    database_options,
    dead_after_option,
    error_filter,
    format_options,
    id_filter,
    kind_filter,
    queue_filter,
    say,
    selection_option,
)
from pgqctl.errors import BadInput, NotFound
from pgqctl.jobs import CANCELLABLE, FIELDS, FINISHED, REQUEUED, STATUS_NAMES, Job
from pgqctl.output.control import pause_summary
from pgqctl.output.formats import emit_number, emit_result, emit_stream, is_human, resolve_format
from pgqctl.output.jobs import emit_job, emit_jobs
from pgqctl.output.limits import limit_summary
from pgqctl.output.progress import progress
from pgqctl.output.stats import emit_stats, estimate_note, live, stats_table
from pgqctl.text import format_seconds, plural

# `schedule`: the schedule and tick of a job a schedule enqueued (left out
# of a table where no job has one).
LIST_COLUMNS = [
    "id",
    "queue",
    "kind",
    "status",
    "attempt",
    "run_at",
    "finished_at",
    "schedule",
    "error",
]


def list_columns(jobs: list[Job]) -> list[str]:
    """The columns of `list`: `schedule` only when a job listed has one."""
    if any(job.schedule is not None for job in jobs):
        return LIST_COLUMNS
    return [c for c in LIST_COLUMNS if c != "schedule"]


LEASE_COLUMNS = ["id", "queue", "kind", "attempt", "locked_by", "locked_until", "left"]
CHANGE_COLUMNS = ["id", "queue", "kind", "status", "attempt", "error"]
REQUEUE_COLUMNS = ["id", "queue", "kind", "status", "attempt", "run_at", "error"]


@command("stats")
@database_options
@click.option(
    "--exact", is_flag=True, help="Count done jobs exactly (reads the whole finished history)."
)
@click.option(
    "--watch",
    type=DURATION,
    metavar="SECONDS",
    # Never from PGQCTL_WATCH: a stray one would make a cron `stats` run forever.
    allow_from_autoenv=False,
    help="Refresh every SECONDS, or a duration such as 500ms or 1m (in place on a "
    "terminal), until Ctrl-C, with the time of each snapshot (ts in JSON). From the "
    "command line only.",
)
@click.option(
    "--metric",
    type=click.Choice(admin.METRICS),
    help="Print this one figure as an integer (for autoscalers and scripts).",
)
@selection_option(
    "--queue",
    "queues",
    metavar="QUEUE",
    multiple=True,
    help="With --metric: the figure of this queue (repeatable: of them together).",
)
@format_options
def stats_command(
    database: Database,
    exact: bool,
    watch: float | None,
    metric: str | None,
    queues: tuple[str, ...],
    fmt: str,
) -> None:
    """Jobs per status, in total and per queue, with expired leases and the
    age of the oldest due pending job.

    Pending, running, failed and cancelled counts are exact. Done counts are exact up to
    1,000 done jobs; beyond that they are estimated from PostgreSQL's table
    statistics (marked ~, and "estimated": true in JSON), so stats stays cheap
    on a long history. A queue's estimate is shown only when the statistics
    bound it to within a factor of 2; else it is ? (null in JSON). --exact
    counts them.

    On a terminal the table fits its width: a long queue name is cut with …;
    no count is, but the cancelled column is left out when it cannot fit
    (--json has every count); a pause, which a narrow table cuts, is also
    said whole on stderr.

    --metric prints one figure as a whole number: the count of a status,
    expired_leases, or oldest_pending_age_seconds (0 when no job is due), of
    every queue or of those given with --queue (summed; the oldest for the
    age), e.g. for a KEDA scaler (docs/operating.md: Autoscaling).

    \b
    Example:
        pgqctl stats
        pgqctl stats --watch 2
        pgqctl stats --json | jq '.totals.failed'
        pgqctl stats --metric pending --queue emails
    """
    if watch is not None and watch <= 0:
        raise BadInput("--watch needs a positive number of seconds, such as --watch 2")
    if queues and metric is None:
        raise BadInput("--queue goes with --metric: `pgqctl stats --metric pending --queue Q`")
    if metric is not None and watch is not None:
        raise BadInput("--metric prints one figure once: give it without --watch")
    with database.connect() as conn, CtrlC() as ctrl_c:

        def snapshot() -> admin.Stats:
            with ctrl_c.snapshot():
                return admin.stats(conn, exact=exact)

        if metric is not None:
            emit_number(admin.metric_value(snapshot(), metric, queues))
        elif watch is None:
            _show_stats(snapshot(), fmt)
        elif resolve_format(fmt) == "table":
            live(lambda: stats_table(snapshot(), _now()), watch)
        else:
            try:
                while True:
                    _show_stats(snapshot(), fmt, _now())
                    sys.stdout.flush()
                    time.sleep(watch)
            except KeyboardInterrupt:
                return


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _show_stats(stats: admin.Stats, fmt: str, ts: dt.datetime | None = None) -> None:
    emit_stats(stats, fmt, ts)
    note = estimate_note(stats)
    if note and is_human(fmt):
        say(note)
    if is_human(fmt):
        # Whole here: a narrow terminal's table cuts or leaves out the column.
        for pause in stats.paused.values():
            say(f"queue {pause.queue} paused {pause_summary(pause.until, pause.reason)}")
        for limit in stats.limits:
            say(limit_summary(limit))


@command("leases")
@database_options
@click.option("--expired", is_flag=True, help="Only leases that are over (what reap takes).")
@format_options
def leases_command(database: Database, expired: bool, fmt: str) -> None:
    """Running jobs: who holds each lease, when it ends, and the time left
    (negative when overdue), soonest end first.

    On a terminal the table fits its width: text is cut with …, times are
    shown shorter (in UTC) and the least important columns left out when
    needed, and no value is broken across lines. Piped, the plain table is
    never narrowed; --json has every field.

    \b
    Example:
        pgqctl leases
        pgqctl leases --expired --json | jq '.[].id'
    """
    with database.connect() as conn:
        held = leases.leases(conn, expired_only=expired)
    emit_jobs(held, LEASE_COLUMNS, fmt, leases.LEASE_FIELDS)
    if not held:
        say("no expired leases" if expired else "no running jobs")


@command("list")
@database_options
@selection_option(
    "--status",
    "statuses",
    type=click.Choice(STATUS_NAMES),
    multiple=True,
    help="Only jobs in this status (repeatable: any of them).",
)
@queue_filter
@kind_filter
@id_filter
@selection_option(
    "--since",
    type=AGE,
    metavar="DURATION",
    help="Only jobs created within this long, with a unit (ms, s, m, h, d, w), e.g. 1h.",
)
@error_filter
@click.option(
    "--order",
    type=click.Choice(admin.ORDERS),
    default="newest",
    show_default=True,
    help="newest: newest first; next: pending jobs in the order workers take them "
    "(priority, then run_at, then id).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=0, max=2**31 - 1),
    default=50,
    show_default=True,
    help="At most this many; 0: every match.",
)
@format_options
def list_command(
    database: Database,
    statuses: tuple[str, ...],
    queues: tuple[str, ...],
    kinds: tuple[str, ...],
    ids: tuple[int, ...],
    since: float | None,
    error: str | None,
    order: str,
    limit: int,
    fmt: str,
) -> None:
    """Jobs, newest first, with why each failed (if it did).

    Each filter given narrows the list; one given several times matches any
    of its values. When more jobs match than are shown, stderr says how many
    (`showing 50 of 434,011`; counted up to 10,000 when done jobs may match,
    as the history can be long). --limit 0 lists every match (in JSON, CSV
    and TSV without holding them all in memory).

    On a terminal the table fits its width: text is cut with …, times are
    shown shorter (in UTC) and the least important columns left out when
    needed, and no value is broken across lines. Piped, the plain table is
    never narrowed; --json has every field.

    \b
    Example:
        pgqctl list --status failed --status running
        pgqctl list --queue emails --kind send_receipt --since 1h --limit 10
        pgqctl list --order next --limit 5
        pgqctl list --status failed --error 'connection refused'
        pgqctl list --status pending --limit 0 --json | jq length
    """
    found = admin.JobFilter(statuses, queues, kinds, ids, since, error)
    matched: admin.Matched | None = None
    counted = False
    with database.connect() as conn:
        if limit == 0 and not is_human(fmt):
            shown = emit_stream(
                (j.as_record() for j in admin.stream_jobs(conn, found, order=order)),
                FIELDS,
                fmt,
            )
        else:
            jobs = admin.select_jobs(conn, found, order=order, limit=limit or None)
            if limit and len(jobs) == limit:
                matched, counted = admin.count_jobs(conn, found), True
            emit_jobs(jobs, list_columns(jobs), fmt, FIELDS)
            shown = len(jobs)
    if not shown:
        say("no jobs match")
    elif counted and matched is None:
        # Not counted: the count would read every done job (docs/commands/list.md).
        say(f"showing {shown:,}; more may match (not counted); --limit to see more")
    elif matched is not None and (not matched.exact or matched.count > shown):
        more = "" if matched.exact else "more than "
        say(f"showing {shown:,} of {more}{matched.count:,}; --limit to see more")


@command("show")
@database_options
@click.argument("job_id", metavar="ID", type=JOB_ID)
@format_options
def show_command(database: Database, job_id: int, fmt: str) -> None:
    """One job, whole: every column, the payload pretty-printed, the full
    last error, and a timeline of its attempts.

    Each attempt on one line: its try number, when it started, the worker
    and slot, how long it ran, how it ended, the CPU time and peak memory
    of its process, and the last line it wrote (`pgqctl logs` shows its
    output). --json has every attempt's fields under "history".

    \b
    Example:
        pgqctl show 42
        pgqctl show 42 --json | jq .payload
    """
    with database.connect() as conn:
        job = admin.get_job(conn, job_id)
        tries = attempts.list_attempts(conn, job_id) if job is not None else []
    if job is None:
        raise NotFound(
            f"job {job_id} not found in schema {database.schema}: "
            "`pgqctl list` shows the jobs there"
        )
    emit_job(job, fmt, tries)


@command("reap")
@database_options
@selection_option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
@dead_after_option
@selection_option(
    "--worker",
    metavar="HOST:PID",
    help="Take back the running jobs of this worker now, as soon as `pgqctl workers` "
    "shows it stale (an active one is refused), and nothing else.",
)
@click.option("--quiet", "-q", is_flag=True, help="Print only when something changed (cron).")
@format_options
def reap_command(
    database: Database,
    dry_run: bool,
    dead_after: int,
    worker: str | None,
    quiet: bool,
    fmt: str,
) -> None:
    """Reclaim expired leases, and the jobs of dead workers: each job goes
    back to pending, or to failed when it has used all its attempts.

    A worker is dead when its row in `pgqctl workers` has seen no heartbeat
    for --dead-after of its own heartbeat intervals (time the server was
    down does not count): its jobs are taken back at once, whatever their
    leases say, and `pgqctl workers` shows it dead. Should it come back, its
    reports for those jobs are dropped, as for any lost lease. --worker
    HOST:PID takes one worker's jobs on demand, once its row is stale (exit
    2 while it heartbeats).

    Jobs a worker is updating at this instant are skipped, not waited on, so
    reap is safe to run from cron while workers run; concurrent reaps never
    handle the same job twice. Workers are woken for the jobs made pending.

    On a terminal the table fits its width: text is cut with …, times are
    shown shorter (in UTC) and the least important columns left out when
    needed, and no value is broken across lines. Piped, the plain table is
    never narrowed; --json has every field (reason: expired, dead or asked).

    \b
    Example:
        pgqctl reap --dry-run
        pgqctl reap --worker web-3:4121
        * * * * *  pgqctl reap --quiet      # crontab: every minute
    """
    with database.connect(writes=not dry_run) as conn:
        if dry_run:
            reaped = leases.reap_preview(conn, dead_after=dead_after, worker=worker)
        else:
            reaped = leases.reap(conn, dead_after=dead_after, worker=worker)
    if not reaped and quiet:
        return
    emit_jobs(reaped, CHANGE_COLUMNS, fmt, leases.REAP_FIELDS)
    if quiet:
        return
    if not reaped:
        say(f"worker {worker} holds no running job" if worker else "no expired leases")
        return
    failed = sum(1 for r in reaped if r.job.status == "failed")
    verb = "would reap" if dry_run else "reaped"
    what = plural(len(reaped), "expired lease")
    if any(r.reason != "expired" for r in reaped):
        what = f"{plural(len(reaped), 'job')} ({reap_causes(reaped)})"
    say(f"{verb} {what}: {len(reaped) - failed} back to pending, {failed} failed (out of attempts)")


def reap_causes(reaped: Sequence[leases.Reaped]) -> str:
    """`2 expired leases, 4 of dead worker h:12`: why the jobs were taken."""
    expired = sum(r.reason == "expired" for r in reaped)
    parts = [plural(expired, "expired lease")] if expired else []
    workers: dict[str, int] = {}
    for r in reaped:
        if r.reason != "expired":
            holder = (r.held_by or "").rpartition(":")[0]
            workers[holder] = workers.get(holder, 0) + 1
    dead = "dead worker" if any(r.reason == "dead" for r in reaped) else "stale worker"
    parts += [f"{n} of {dead} {holder}" for holder, n in sorted(workers.items())]
    return ", ".join(parts)


@command("requeue")
@database_options
@selection_option("--failed", "all_failed", is_flag=True, help="Failed jobs (all, or as narrowed).")
@selection_option(
    "--cancelled",
    "all_cancelled",
    is_flag=True,
    help="Cancelled jobs (all, or as narrowed), as failed ones.",
)
@selection_option(
    "--pending",
    "all_pending",
    is_flag=True,
    help="Pending jobs (all, or as narrowed): due now, attempts untouched.",
)
@id_filter
@kind_filter
@queue_filter
@selection_option(
    "--since",
    type=AGE,
    metavar="DURATION",
    help="Only jobs finished (pending ones: created) within this long, with a unit "
    "(ms, s, m, h, d, w), e.g. 1h.",
)
@error_filter
@selection_option(
    "--attempts",
    "more",
    type=click.IntRange(min=1, max=1_000_000),
    default=1,
    show_default=True,
    help="Tries each failed or cancelled job gets: max_attempts becomes the tries used + N.",
)
@selection_option(
    "--limit",
    type=click.IntRange(min=0, max=2**31 - 1),
    help="At most this many jobs: the oldest finished first (pending ones: soonest due); "
    "0: every match, as `list --limit 0`.",
)
@selection_option(
    "--spread",
    type=AGE,
    metavar="DURATION",
    help="Spread their run_at evenly over this window from now, in --limit's order, e.g. 10m.",
)
@selection_option("--dry-run", is_flag=True, help="Show what would move; change nothing.")
@format_options
def requeue_command(
    database: Database,
    all_failed: bool,
    all_cancelled: bool,
    all_pending: bool,
    ids: tuple[int, ...],
    kinds: tuple[str, ...],
    queues: tuple[str, ...],
    since: float | None,
    error: str | None,
    more: int,
    limit: int | None,
    spread: float | None,
    dry_run: bool,
    fmt: str,
) -> None:
    """Move failed or cancelled jobs back to pending, or make pending jobs due
    now, all in one statement.

    Select by status with --failed, --cancelled and --pending (any of them),
    and narrow with --id, --kind, --queue, --since and --error (each given
    narrows further; one given several times matches any of its values). Without a
    status: failed jobs, or, with --id, the job in whichever of these
    statuses it is.

    A failed or cancelled job gets --attempts more tries: attempts is kept
    (it fences stale workers) and max_attempts is raised; last_error is kept
    until a later failure replaces it. A pending job (delayed, or waiting
    for a retry) becomes due now, never later than it was, its attempts
    untouched. A job whose unique key a pending or running job holds is left
    as it is.

    To replay many jobs without a stampede, --limit takes the oldest
    finished first and --spread sets their run_at evenly over a window, in
    that order; --dry-run shows the run_at each would get.

    On a terminal the table fits its width: text is cut with …, times are
    shown shorter (in UTC) and the least important columns left out when
    needed, and no value is broken across lines. Piped, the plain table is
    never narrowed; --json has every field.

    \b
    Example:
        pgqctl requeue --id 5
        pgqctl requeue --failed --kind send_receipt --since 1h --dry-run
        pgqctl requeue --failed --error "connection refused" --spread 5m
        pgqctl requeue --queue emails --queue sms --attempts 3
        pgqctl requeue --pending --kind report
        pgqctl requeue --failed --kind webhook --limit 50000 --spread 10m
    """
    chosen = [
        status
        for status, given in (
            ("failed", all_failed),
            ("cancelled", all_cancelled),
            ("pending", all_pending),
        )
        if given
    ]
    if spread is not None and spread <= 0:
        raise BadInput("--spread needs a window longer than 0, such as --spread 10m")
    if not chosen and not (ids or kinds or queues or since is not None or error):
        raise BadInput(
            "nothing selected: give --failed, --cancelled or --pending to requeue every "
            "job in that status, or narrow with --id, --kind, --queue, --since or --error"
        )
    if limit == 0:
        limit = None  # every match, as `list --limit 0`
    if not chosen:
        # An --id names its job whatever it is; a filter alone, failed jobs.
        chosen = list(REQUEUED) if ids else ["failed"]
    selection = admin.Selection(
        statuses=tuple(chosen), ids=ids, kinds=kinds, queues=queues, since=since, error=error
    )
    with database.connect(writes=not dry_run) as conn:
        unknown = control.unknown_queues(conn, queues)
        result = admin.requeue(
            conn, selection, more=more, limit=limit, spread=spread or 0.0, dry_run=dry_run
        )
    say_unknown_queues(unknown, {job.queue for job in result.jobs})
    emit_jobs(result.jobs, REQUEUE_COLUMNS, fmt, FIELDS)
    held_ids = {job.id for job, _ in result.held}
    for job_id, status in result.left.items():
        if job_id in held_ids:
            continue
        if status is None:
            say(f"job {job_id} not found")
        elif status not in REQUEUED:
            say(
                f"job {job_id} is {status}: requeue takes {_statuses(REQUEUED)} jobs; left as it is"
            )
        elif status not in chosen:
            say(f"job {job_id} is {status}, not {_statuses(chosen, 'or')}: left as it is")
        else:
            beyond = " or is beyond --limit" if limit is not None else ""
            say(
                f"job {job_id} is {status} but does not match the other filters{beyond}: "
                "left as it is"
            )
    for job, holder in result.held[:_HELD_SHOWN]:
        say(
            f"job {job.id} left as it is: job {holder} holds its unique key "
            f"{job.unique_key!r} in queue {job.queue!r}"
        )
    if len(result.held) > _HELD_SHOWN:
        say(f"and {len(result.held) - _HELD_SHOWN:,} more left for their unique key")
    verb = "would requeue" if dry_run else "requeued"
    jobs = result.jobs
    if jobs:
        window = f", run_at spread over {format_seconds(spread)}" if spread else ""
        say(f"{verb} {plural(len(jobs), 'job')}{window}")
    else:
        say(f"no {_statuses(chosen, 'or')} jobs match")
    if None in result.left.values():
        raise NotFound(
            "some --id jobs do not exist: `pgqctl list --status failed` lists the failed ones"
        )


@command("cancel")
@database_options
@id_filter
@queue_filter
@kind_filter
@selection_option(
    "--status",
    "statuses",
    type=click.Choice(CANCELLABLE),
    multiple=True,
    help="Only jobs in this status (repeatable; default: " + " and ".join(CANCELLABLE) + ").",
)
@selection_option(
    "--reason", metavar="TEXT", help="Why, kept in each job's last_error (cancelled: TEXT)."
)
@selection_option("--dry-run", is_flag=True, help="Show what would be cancelled; change nothing.")
@format_options
def cancel_command(
    database: Database,
    ids: tuple[int, ...],
    queues: tuple[str, ...],
    kinds: tuple[str, ...],
    statuses: tuple[str, ...],
    reason: str | None,
    dry_run: bool,
    fmt: str,
) -> None:
    """Cancel pending or running jobs: each ends cancelled, finished now, and
    is never claimed again (`requeue` brings it back).

    Select with --id, --queue, --kind and --status (at least one; each given
    narrows further, one given several times matches any of its values).
    last_error says `cancelled: REASON` (`cancelled by an operator` without
    --reason); attempts is kept.

    A running job's worker, on whichever host, is told at once and stops the
    job's whole process group (SIGTERM, then SIGKILL), without retrying it; a
    worker that cannot hear notifications finds out at its next lease renewal
    (within a third of the lease). A job whose worker is gone (lease expired)
    is simply cancelled. A job that ends while it is being cancelled ends one
    way or the other, never both.

    On a terminal the table fits its width: text is cut with …, times are
    shown shorter (in UTC) and the least important columns left out when
    needed, and no value is broken across lines. Piped, the plain table is
    never narrowed; --json has every field.

    \b
    Example:
        pgqctl cancel --id 42 --reason "sent to the wrong customer"
        pgqctl cancel --queue emails --status pending --dry-run
        pgqctl cancel --kind resize --json | jq '.[].id'
    """
    selection = admin.CancelSelection(ids=ids, queues=queues, kinds=kinds, statuses=statuses)
    if not (ids or queues or kinds or statuses):
        raise BadInput(
            "nothing selected: give --id, --queue, --kind or --status "
            f"({' or '.join(CANCELLABLE)}) to say which jobs to cancel"
        )
    with database.connect(writes=not dry_run) as conn:
        unknown = control.unknown_queues(conn, queues)  # before: a cancel can empty a queue
        result = admin.cancel(conn, selection, reason=reason, dry_run=dry_run)
    say_unknown_queues(unknown, {c.job.queue for c in result.jobs})
    emit_jobs(result.jobs, CHANGE_COLUMNS, fmt, admin.CANCEL_FIELDS)
    takes = " or ".join(selection.statuses or CANCELLABLE)
    for job_id, status in result.left.items():
        if status is None:
            say(f"job {job_id} not found")
        elif status in (selection.statuses or CANCELLABLE):
            say(f"job {job_id} is {status} but does not match the other filters: left as it is")
        else:
            say(f"job {job_id} is {status}: cancel takes {takes} jobs; left as it is")
    jobs = result.jobs
    if not jobs:
        say(f"no {takes} jobs match")
    else:
        pending = sum(1 for c in jobs if c.cancelled_from == "pending")
        gone = sum(1 for c in jobs if c.lease_expired)
        told = len(jobs) - pending - gone
        parts = [f"{pending} pending"] if pending else []
        if told:
            told_to = "would be told" if dry_run else "are told"
            parts.append(f"{told} running (their workers {told_to} to stop them)")
        if gone:
            parts.append(f"{gone} running whose worker is gone (lease expired)")
        verb = "would cancel" if dry_run else "cancelled"
        say(f"{verb} {plural(len(jobs), 'job')}: {', '.join(parts)}")
    if None in result.left.values():
        raise NotFound(
            "some --id jobs do not exist: `pgqctl list --status pending --status running` "
            "lists the jobs cancel takes"
        )


def say_unknown_queues(unknown: Sequence[control.UnknownQueue], matched: set[str]) -> None:
    """A --queue that matched nothing and names no queue at all is most
    likely a typo: say so, with the name it was probably meant to be."""
    for queue in unknown:
        if queue.queue not in matched:
            say(queue.message())


# Jobs left for their unique key named one by one; the rest counted.
_HELD_SHOWN = 10


def _statuses(names: Sequence[str], last: str = "and") -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


@command("purge")
@database_options
@selection_option(
    "--status",
    "statuses",
    type=click.Choice([*FINISHED, "all"]),
    multiple=True,
    default=["done"],
    show_default=True,
    help="Finished status to delete (repeatable; all = " + ", ".join(FINISHED) + ").",
)
@selection_option(
    "--older-than",
    type=AGE,
    default=0.0,
    metavar="DURATION",
    help="Only jobs finished longer ago than this, with a unit (ms, s, m, h, d, w), e.g. 7d.",
)
@selection_option(
    "--attempts-older-than",
    type=AGE,
    metavar="DURATION",
    help="Delete the attempt history (what `show` and `logs` read) of attempts that "
    "ended longer ago than this, whatever their job, e.g. 7d. Alone, it deletes no job.",
)
@click.option(
    "--batch-size",
    type=COUNT,
    default=10_000,
    show_default=True,
    help="Rows deleted per transaction.",
)
@click.option(
    "--pause",
    type=DURATION_OR_AUTO,
    default="auto",
    show_default=True,
    metavar="DURATION|auto",
    help="Rest between batches. auto rests as long as the last batch took, so the "
    "workers' commits never queue behind the purge for long; 0 deletes flat out.",
)
@selection_option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@format_options
@click.pass_context
def purge_command(
    ctx: click.Context,
    database: Database,
    statuses: tuple[str, ...],
    older_than: float,
    attempts_older_than: float | None,
    batch_size: int,
    pause: float | None,
    dry_run: bool,
    fmt: str,
) -> None:
    """Delete finished jobs, done by default, in batches of short transactions
    so workers never wait on more than one batch.

    Only jobs that finished before the purge started are deleted; pending and
    running jobs are never touched. A job's attempts go with it.
    --attempts-older-than gives the attempt history a retention of its own
    (a job retried 25 times keeps 25 attempts, each with its output): given
    alone, it deletes old attempts and no job; with --status or --older-than,
    both.

    \b
    Example:
        pgqctl purge --older-than 7d
        pgqctl purge --status failed --older-than 30d --dry-run
        pgqctl purge --attempts-older-than 3d
        pgqctl purge --status all --json
        pgqctl purge --older-than 30d --pause 0   # flat out, in a quiet hour
    """
    given = {
        name
        for name in ("statuses", "older_than")
        if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
    }
    purge_jobs = attempts_older_than is None or bool(given)
    chosen = admin.purge_statuses(statuses)
    what = f"{' and '.join(chosen)} jobs" + (
        f" finished more than {format_seconds(older_than)} ago" if older_than else ""
    )
    old_attempts = (
        f"attempts ended more than {format_seconds(attempts_older_than)} ago"
        if attempts_older_than is not None
        else ""
    )
    result: dict[str, Any] = {}
    with database.connect(writes=not dry_run) as conn:
        plan = admin.purge_plan(conn, chosen, older_than)
        cutoff = None
        if attempts_older_than is not None:
            cutoff = admin.purge_plan(conn, (), attempts_older_than).cutoff
        if dry_run:
            result = {"deleted": 0, "dry_run": True}
            if purge_jobs:
                result["matched"] = admin.purge_count(conn, plan)
                say(f"would delete {result['matched']} {what}")
            if cutoff is not None:
                result["attempts_matched"] = attempts.purge_count(conn, cutoff)
                say(f"would delete {result['attempts_matched']} {old_attempts}")
            emit_result(result, fmt)
            return
        if purge_jobs:
            total = admin.purge_count(conn, plan) if sys.stderr.isatty() else None
            dropped: list[history.DroppedDay] = []
            with progress(total, f"deleting {what}") as advance:
                result["deleted"] = admin.purge(
                    conn,
                    plan,
                    batch_size=batch_size,
                    on_batch=advance,
                    pause=pause,
                    dropped=dropped,
                )
            if dropped:
                result["dropped_days"] = [
                    {"day": d.day.isoformat(), "estimated_rows": d.rows} for d in dropped
                ]
            history.keep_ahead(conn)
        if cutoff is not None:
            total = attempts.purge_count(conn, cutoff) if sys.stderr.isatty() else None
            with progress(total, f"deleting {old_attempts}") as advance:
                result["attempts_deleted"] = attempts.purge(
                    conn, cutoff, batch_size=batch_size, on_batch=advance, pause=pause
                )
    emit_result(result, fmt)
    if purge_jobs:
        for day in result.get("dropped_days", []):
            about = "" if day["estimated_rows"] is None else f", about {day['estimated_rows']} jobs"
            say(f"dropped the history's done jobs of {day['day']} whole{about}")
        say(f"deleted {result['deleted']} {what}" + (" row by row" if dropped else ""))
    if cutoff is not None:
        say(f"deleted {result['attempts_deleted']} {old_attempts}")
