"""Seeing the fleet and being told: workers (library: pgqctl/registry.py),
check (thresholds for alerting), metrics (Prometheus) and top (a live
view) (library: pgqctl/monitor.py)."""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

import click

from pgqctl import config, monitor, schedules
from pgqctl.commands.ctrl_c import CtrlC
from pgqctl.commands.options import (
    AGE,
    DURATION,
    Database,
    command,
    database_options,
    format_options,
    say,
    selection_option,
)
from pgqctl.errors import EXIT_CHECK, BadInput, PgqctlError
from pgqctl.output.check import emit_check
from pgqctl.output.control import pause_summary
from pgqctl.output.formats import is_human
from pgqctl.output.metrics import emit_metrics, metrics_text, write_metrics_textfile
from pgqctl.output.top import top_render, top_screen
from pgqctl.output.workers import emit_workers
from pgqctl.text import plural

# A threshold on a count: 0 is a limit too (`--max-failed 0`: none tolerated).
LIMIT = click.IntRange(min=0)


def threshold_options(func: Any) -> Any:
    """One option per entry of monitor.THRESHOLDS, in that order."""
    for threshold in reversed(monitor.THRESHOLDS):
        text = threshold.help
        if threshold.default is not None:
            text += f" With no threshold given: {threshold.spelled(threshold.default)}."
        func = click.option(
            threshold.option,
            threshold.name,
            type=AGE if threshold.duration else LIMIT,
            metavar="DURATION" if threshold.duration else "N",
            help=text,
        )(func)
    return func


def _defaults_text() -> str:
    return ", ".join(
        f"{t.option} {t.spelled(t.default)}" for t in monitor.THRESHOLDS if t.default is not None
    )


@command("workers")
@database_options
@format_options
def workers_command(database: Database, fmt: str) -> None:
    """The registered workers: whether each is alive, what it serves, and
    the jobs it holds now.

    Every `pgqctl worker` registers itself when it starts and heartbeats
    every --heartbeat (5s by default) on the statements it sends anyway;
    a clean stop removes its row. A worker is active while its last
    heartbeat is at most three of its own intervals old, and stale after
    that: killed, or cut off from the database. It is dead once a reap took
    back its jobs for it (no heartbeat for `reap --dead-after` of its
    intervals, or `reap --worker`), until it heartbeats again: reaped_at
    says when, reaped_jobs how many jobs. Any worker removes a row stale
    for an hour.

    Queues and kinds `all`: the worker claims from every one. running, done
    and failed are as of its last heartbeat (done and failed: attempts
    since it started); jobs are the running jobs whose locked_by names it
    now (locked_by is HOST:PID:SLOT), and prefetched the jobs it claimed
    ahead of a free slot and has not started yet (worker --prefetch;
    locked_by HOST:PID:prefetch). On a terminal the table fits its width;
    --json has every field.

    \b
    Example:
        pgqctl workers
        pgqctl workers --json | jq -r '.[] | select(.state == "stale") | .id'
    """
    from pgqctl import registry

    with database.connect() as conn:
        found = registry.list_workers(conn)
    emit_workers(found, fmt, registry.FIELDS)
    if not found:
        say("no workers registered")
    elif is_human(fmt):
        stale = sum(w.state == "stale" for w in found)
        dead = sum(w.state == "dead" for w in found)
        active = f"{plural(len(found) - stale - dead, 'worker')} active"
        say(active + (f", {stale} stale" if stale else "") + (f", {dead} dead" if dead else ""))


@command("check")
@database_options(lock_timeout="2s", statement_timeout="10s")
@threshold_options
@selection_option(
    "--queue",
    "queues",
    metavar="QUEUE",
    multiple=True,
    help="Check only this queue (repeatable), even if it has no jobs.",
)
@selection_option(
    "--schedules",
    "with_schedules",
    is_flag=True,
    help="Also hold every schedule to its ticks: a tick not enqueued within "
    f"{schedules.MISSED_GRACE:g}s of its time is a breach (one line per schedule).",
)
@selection_option(
    "--include-paused",
    is_flag=True,
    help="Hold paused queues to the backlog thresholds too (pending age and count, stalled).",
)
@selection_option(
    "--max-held-back-age",
    type=AGE,
    metavar="DURATION",
    help="Also hold every limit (`pgqctl limit`): a due job it has held back longer than "
    "this is a breach (one line per limit), e.g. 10m.",
)
@selection_option(
    "--max-unmoved-age",
    type=AGE,
    metavar="DURATION",
    help="Also hold the history: a finished job still in jobs, not moved into the history "
    "by a worker (`worker --archive-after`), for longer than this is a breach, e.g. 1d.",
)
@format_options
def check_command(
    database: Database,
    queues: tuple[str, ...],
    with_schedules: bool,
    include_paused: bool,
    max_held_back_age: float | None,
    max_unmoved_age: float | None,
    fmt: str,
    **given: Any,
) -> None:
    """Hold every queue to thresholds, for cron, Nagios-style monitors and
    probes: exit 0 when all hold, 3 when one does not, 1 when the queue
    cannot be read (a check that cannot check never says OK).

    Each threshold applies to every queue on its own (only to those named
    with --queue, when given); a --max-* threshold is breached when the
    figure is above it, --min-workers when fewer active workers serve the
    queue. Each breach is one line on stdout, and nothing else
    is written there: `CRITICAL emails: oldest pending job waited 12m (max
    5m)`. --json gives every figure of every queue, its threshold and
    whether it holds ("ok"), per figure and overall, with the same exit
    codes.

    With no threshold given, check applies DEFAULTS; given any, it
    applies only those given. Durations need a unit (ms, s, m, h, d, w).

    Stalled: due jobs have waited longer than --stalled and no job of the
    queue finished within it (the queue looks busy but nothing moves).
    Failed jobs count until they are requeued or purged, whatever their
    age. Every figure comes from the live jobs and those finished within
    --stalled, never from the history before it.

    With --schedules, each schedule whose tick no worker enqueued in time
    is one more breach line: `CRITICAL schedule nightly: tick ... missed`.
    With --max-held-back-age, so is each limit that has held a due job back
    longer: `CRITICAL limit kind report: 1,997 due jobs held back ...`.
    With --max-unmoved-age, so is a finished job the workers have left in
    jobs longer (none moves them into the history).

    A paused queue's jobs wait on purpose: it is not held to --max-pending-age,
    --max-pending nor --stalled unless --include-paused, and each paused
    queue is named on stderr (`queue emails is paused ...`); --json says
    "paused" per queue.

    \b
    Example:
        pgqctl check
        pgqctl check --max-pending-age 5m --max-failed 0 --stalled 10m
        pgqctl check --queue emails --max-pending 1000 --json
        pgqctl check --schedules
        */5 * * * *  pgqctl check --stalled 15m || notify-team   # crontab
    """
    thresholds = monitor.applied(given)
    with database.connect() as conn:
        result = monitor.check(
            conn,
            thresholds,
            queues,
            with_schedules=with_schedules,
            include_paused=include_paused,
            max_held_back_age=max_held_back_age,
            max_unmoved_age=max_unmoved_age,
        )
    emit_check(result, fmt)
    for q in result.queues:
        if q.pause is not None:
            held = "held to" if include_paused else "not held to"
            pause = pause_summary(q.pause.until, q.pause.reason)
            say(
                f"queue {q.queue} is paused ({pause}): its backlog is {held} the thresholds "
                f"(`pgqctl resume {q.queue}` resumes it)"
            )
    breaches = result.breaches()
    if breaches:
        say(f"{plural(len(breaches), 'threshold')} breached")
        raise click.exceptions.Exit(EXIT_CHECK)
    held = ", ".join(f"--{n.replace('_', '-')}" for n in thresholds)
    ticking = (
        "" if result.schedules is None else f"; {plural(len(result.schedules), 'schedule')} on time"
    )
    if result.limits is not None:
        ticking += f"; {plural(len(result.limits), 'limit')} within --max-held-back-age"
    say(f"ok: {plural(len(result.queues), 'queue')} within {held}{ticking}")


# Said in --help from the one list of thresholds.
check_command.help = (check_command.help or "").replace("DEFAULTS", _defaults_text())


class ListenAddress(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """HOST:PORT, :PORT (every interface) or [IPv6]:PORT; port 0 picks a free one."""

    name = "host:port"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value
        host, sep, port = str(value).rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not sep or not port.isdigit() or int(port) > 65535 or "]" in host:
            self.fail(
                f"{value!r} is not HOST:PORT: give e.g. :9464 (every interface) or 127.0.0.1:9464",
                param,
                ctx,
            )
        return host, int(port)


@command("metrics")
@database_options(lock_timeout="2s", statement_timeout="10s")
@click.option(
    "--exact",
    is_flag=True,
    help="Also count done jobs, exactly (reads the whole finished history at each run).",
)
@click.option(
    "--textfile",
    metavar="PATH",
    allow_from_autoenv=False,
    help="Write to PATH (for node_exporter's textfile collector; name it *.prom), "
    "replacing it at once: a reader never sees part of a file.",
)
@click.option(
    "--listen",
    type=ListenAddress(),
    metavar="HOST:PORT",
    allow_from_autoenv=False,
    help="Serve over HTTP at /metrics, e.g. :9464, reading the queue afresh for "
    "each scrape, until SIGTERM or Ctrl-C.",
)
def metrics_command(
    database: Database, exact: bool, textfile: str | None, listen: tuple[str, int] | None
) -> None:
    """The queue's figures in the Prometheus text exposition format: to
    stdout, to a file, or served over HTTP.

    \b
    pgqctl_jobs{queue,status}                   jobs per queue and status
    pgqctl_oldest_pending_age_seconds{queue}    the oldest due pending job's wait
    pgqctl_expired_leases{queue}                leases over, not yet reaped
    pgqctl_jobs_finished_last_minute{queue,outcome}   throughput: done, failed
    pgqctl_workers{state}                       workers active and stale
    pgqctl_queue_workers{queue}                 active workers serving the queue

    The counts are those of `pgqctl stats`, exact, but for done jobs: they
    are the history, left out unless --exact counts them all (the throughput
    is the figure to watch). The jobs finished in the last minute are read
    from that minute's rows only. Served, a scrape the database cannot answer
    gets 503 with the reason, and the server goes on. --textfile and
    --listen are read from the command line only.

    \b
    Example:
        pgqctl metrics
        * * * * *  pgqctl metrics --textfile /var/lib/node_exporter/pgqctl.prom
        pgqctl metrics --listen :9464
    """
    if textfile is not None and listen is not None:
        raise click.UsageError("give --textfile or --listen, not both")

    def read() -> Any:
        # Explained here too: a scrape's error is answered, not raised.
        with database.explained(), database.connect() as conn:
            return monitor.metrics_registry(monitor.metrics_snapshot(conn, exact=exact))

    if listen is None:
        registry = read()  # read whole before anything is written
        if textfile is None:
            emit_metrics(registry)
        else:
            write_metrics_textfile(textfile, registry)
        return
    host, port = listen
    try:
        server = monitor.metrics_server(
            host,
            port,
            lambda: metrics_text(read()),
            on_error=lambda why: say(f"scrape failed: {why}"),
        )
    except OSError as exc:
        where = f"{host or '*'}:{port}"
        why = exc.strerror or exc
        raise PgqctlError(f"cannot listen on {where}: {why}; give another --listen") from exc
    bound_host, bound_port = server.server_address[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    say(f"serving metrics on http://{shown}:{bound_port}/metrics; SIGTERM or Ctrl-C stops")
    # Signals only raise a flag, looked at between requests: an exception
    # raised from a handler mid-request would be taken for the request's own
    # error (wsgiref answers 500 and serves on).
    stopping: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: stopping.append(signum))
    server.timeout = 0.2  # how soon a signal is seen when no scrape comes
    try:
        while not stopping:
            server.handle_request()
    finally:
        server.server_close()
    say("stopped serving metrics")


@command("top")
@database_options
@click.option(
    "--interval",
    type=DURATION,
    default="1s",
    show_default=True,
    metavar="DURATION",
    help="Refresh every DURATION, e.g. 2s or 500ms.",
)
@click.option(
    "--leases",
    "lease_count",
    type=click.IntRange(min=0, max=1000),
    default=10,
    show_default=True,
    help="How many of the leases ending soonest to show.",
)
def top_command(database: Database, interval: float, lease_count: int) -> None:
    """A live view of the queue on the whole terminal, refreshed in place:
    per queue the pending and running jobs, the jobs done and failed per
    second since the last refresh, the oldest due job's wait and when any
    pause ends; the running jobs whose leases end soonest; the registered
    workers, active or stale; per kind, the run time percentiles of the
    last minute's attempts. Each row stays on one line: on a narrow
    terminal, names are cut with ….

    q or Ctrl-C leaves it, the terminal as it was. Every refresh reads what
    `metrics` reads (the live jobs and those finished since the last
    refresh), never the history. Not on a terminal, use `pgqctl stats
    --watch 1`.

    \b
    Example:
        pgqctl top
        pgqctl top --interval 5s --leases 20
    """
    if interval <= 0:
        raise BadInput("--interval needs a positive duration, such as --interval 2s")
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise BadInput(
            "top needs a terminal: for a refreshing view elsewhere use `pgqctl stats --watch 1`"
        )
    with database.connect() as conn, CtrlC() as ctrl_c:
        where = config.describe(conn.info.dsn)
        last = [time.monotonic() - interval]
        shown: set[str] = set()

        def render() -> Any:
            now = time.monotonic()
            window, last[0] = max(now - last[0], 0.001), now
            with ctrl_c.snapshot():
                view = monitor.top_view(conn, window=window, leases=lease_count, shown_before=shown)
            shown.update(view.queues())
            return top_render(view, where, interval)

        top_screen(render, interval)
