"""`pgqctl worker`: run jobs (library: pgqctl/worker/, which runs them with
pgqctl/runner.py as pgqctl/payload.py says)."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

import click

from pgqctl.commands.options import (
    COUNT,
    DURATION,
    Database,
    command,
    database_options,
    dead_after_option,
    debugging,
    max_payload_bytes_option,
    no_empty_names,
)
from pgqctl.schedules import CATCH_UP, CATCH_UP_MAX, MISSED_GRACE
from pgqctl.worklog import (  # small; the options need it
    KEEP_OUTPUT_BYTES,
    LOG_FORMATS,
    LOG_OUTPUT_BYTES,
    LOG_OUTPUT_LINES,
    WorkLog,
)


class KindSpec(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """`KIND=VALUE`, one per line in its environment variable (values hold spaces)."""

    envvar_list_splitter = "\n"
    example = ""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        kind, sep, rest = str(value).partition("=")
        if not sep or not kind.strip() or not rest.strip():
            self.fail(f"{value!r} is not {self.name.upper()}, {self.example}", param, ctx)
        return kind.strip(), self.value_of(rest, value, param, ctx)

    def value_of(
        self, text: str, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Any:
        return text.strip()


class HandlerSpec(KindSpec):
    """`KIND=COMMAND`, COMMAND split like a shell would (no shell runs it)."""

    name = "kind=command"
    example = "e.g. --handler 'resize=convert-image --quality 80'"

    def value_of(
        self, text: str, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, ...]:
        try:
            return tuple(shlex.split(text))
        except ValueError as exc:
            self.fail(f"cannot split the command of {value!r}: {exc}, {self.example}", param, ctx)


class SqlSpec(KindSpec):
    """`KIND=STATEMENT`: the statement a kind's jobs run, $1 their payload."""

    name = "kind=statement"
    example = "e.g. --sql 'create_invoice=CALL create_invoice($1)'"


@command("worker")
@database_options(lock_timeout="10s", statement_timeout="30s")
@click.option(
    "--queue",
    "queues",
    multiple=True,
    envvar="PGQCTL_QUEUE",
    metavar="QUEUE",
    callback=no_empty_names,
    help="Claim only jobs of this queue (repeatable; default: every queue).",
)
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    envvar="PGQCTL_KIND",
    metavar="KIND",
    callback=no_empty_names,
    help="Claim only jobs of this kind (repeatable; default: every kind).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=os.cpu_count() or 1,
    show_default="the number of CPUs",
    help="Jobs run at the same time.",
)
@click.option(
    "--prefetch",
    type=click.IntRange(min=0, max=10_000),
    default=0,
    show_default=True,
    help="Claim up to this many jobs beyond the free slots, each started as soon as a slot "
    "frees: for many short jobs (see docs/commands/worker.md).",
)
@click.option(
    "--lease",
    type=DURATION,
    default="5m",
    show_default=True,
    help="How long a claim holds a job; renewed every third of it while the job runs.",
)
@click.option(
    "--poll",
    type=DURATION,
    default=None,
    help="Look for jobs this often even without a notification. "
    "Default: 5s, or 1s while notifications cannot be heard (a transaction pooler).",
)
@click.option(
    "--listen-dsn",
    metavar="DSN",
    help="A direct or session-pooled connection used only to LISTEN, "
    "when --dsn goes through a transaction pooler.",
)
@click.option(
    "--timeout",
    type=DURATION,
    default=None,
    help="Stop jobs that run longer (a payload's own timeout wins). Default: no limit.",
)
@click.option(
    "--grace",
    type=DURATION,
    default="30s",
    show_default=True,
    help="On SIGTERM/SIGINT/SIGHUP, how long running jobs may finish before they are stopped.",
)
@click.option(
    "--backoff",
    type=DURATION,
    default="2s",
    show_default=True,
    help="Retry delay after a first failure; doubles with each attempt (±25%, at most 1h).",
)
@click.option(
    "--reap-every",
    type=DURATION,
    default="30s",
    show_default=True,
    help="Reclaim expired leases (as `pgqctl reap` does) about this often (±25%), "
    "and once before --burst exits.",
)
@dead_after_option
@click.option(
    "--no-reap",
    is_flag=True,
    help="Reclaim no expired leases; leave it to `pgqctl reap` from cron.",
)
@click.option(
    "--archive-after",
    type=DURATION,
    default="10m",
    show_default=True,
    help="Move jobs finished this long ago out of jobs into the history (jobs_history, "
    "partitioned by day, which `pgqctl purge` drops whole), a few thousand at a time "
    "about every 30s; every command reads both.",
)
@click.option(
    "--no-archive",
    is_flag=True,
    help="Move no finished job into the history: it stays in jobs until purged.",
)
@click.option(
    "--no-schedules",
    is_flag=True,
    help="Enqueue no schedule's ticks; leave it to the other workers.",
)
@click.option(
    "--catch-up",
    type=click.Choice(CATCH_UP),
    default="latest",
    show_default=True,
    help="Ticks missed while no worker ran (not enqueued within "
    f"{MISSED_GRACE:g}s): enqueue the latest "
    f"one, none, or all (at most the {CATCH_UP_MAX} most recent of each schedule).",
)
@click.option(
    "--heartbeat",
    type=DURATION,
    default="5s",
    show_default=True,
    help="Heartbeat in `pgqctl workers` at least this often; shown stale after three missed.",
)
@click.option(
    "--burst",
    is_flag=True,
    help="Exit once no job is due (or due within a second) and none is running.",
)
@click.option(
    "--max-jobs",
    type=COUNT,
    default=None,
    help="Exit after claiming this many jobs (once they finish).",
)
@click.option("--allow-shell", is_flag=True, help='Run {"shell": "..."} payloads with /bin/sh.')
@click.option(
    "--handler",
    "handlers",
    type=HandlerSpec(),
    multiple=True,
    envvar="PGQCTL_HANDLER",
    metavar="KIND=COMMAND",
    help="Run COMMAND for jobs of KIND, with the payload as JSON on stdin (repeatable).",
)
@click.option(
    "--serve",
    "serve",
    type=HandlerSpec(),
    multiple=True,
    envvar="PGQCTL_SERVE",
    metavar="KIND=COMMAND",
    help="Start COMMAND once per slot and keep it running: each job of KIND is a JSON "
    "line on its stdin, answered by a result line on its stdout (see `Resident "
    "handlers` in the docs; repeatable).",
)
@click.option(
    "--max-jobs-per-process",
    type=COUNT,
    default=None,
    metavar="N",
    help="With --serve: retire a resident process after N jobs (its stdin closed), "
    "and start a new one.",
)
@click.option(
    "--sql",
    "sql_handlers",
    type=SqlSpec(),
    multiple=True,
    envvar="PGQCTL_SQL",
    metavar="KIND=STATEMENT",
    help="Run STATEMENT for jobs of KIND ($1: the payload as JSON), committed with the "
    "job's done in one transaction (repeatable).",
)
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Run only what this policy file allows (TOML; see docs/worker.md), "
    "e.g. --policy /etc/pgqctl/policy.toml.",
)
@click.option(
    "--handlers-only",
    is_flag=True,
    help="Run only jobs whose kind has a handler; refuse argv and shell payloads.",
)
@click.option(
    "--allow-program",
    "allow_programs",
    type=click.Path(),  # PGQCTL_ALLOW_PROGRAM splits on ":", as PATH does
    multiple=True,
    metavar="PATH",
    help="Run only programs that are this file or lie under this directory, once "
    "resolved (repeatable), e.g. --allow-program /usr/local/lib/jobs/.",
)
@click.option(
    "--allow-env",
    "allow_env",
    multiple=True,
    metavar="NAME",
    help="Let a payload's env set this loader variable (PATH, LD_*, PYTHONPATH...), "
    "which a policy otherwise refuses (repeatable).",
)
@max_payload_bytes_option("Fail for good, never running it, a job that has")
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    help="Log lines on stderr: text, or one JSON object per line.",
)
@click.option(
    "--log-output-lines",
    type=click.IntRange(min=0),
    metavar="N",
    default=LOG_OUTPUT_LINES,
    show_default=True,
    help="Log at most this many lines of each job's output (its first ones); "
    "a line at the job's end says how much was left out.",
)
@click.option(
    "--log-output-bytes",
    type=click.IntRange(min=0),
    metavar="BYTES",
    default=LOG_OUTPUT_BYTES,
    show_default=True,
    help="Log at most this many bytes of each job's output, e.g. --log-output-bytes 1048576.",
)
@click.option(
    "--keep-output",
    type=click.IntRange(min=0),
    metavar="BYTES",
    default=KEEP_OUTPUT_BYTES,
    show_default=True,
    help="Keep at most this many bytes of each stream (stdout, stderr) of each attempt in its "
    "history (`pgqctl logs`): half from its start, half from its end; 0 keeps none.",
)
@click.option(
    "--history/--no-history",
    default=True,
    show_default=True,
    help="Record every attempt (how it ended, its output, what it cost) for `pgqctl show` "
    "and `pgqctl logs`; --no-history records none: a job keeps only its last_error.",
)
def worker_command(
    database: Database,
    queues: tuple[str, ...],
    kinds: tuple[str, ...],
    concurrency: int,
    prefetch: int,
    lease: float,
    poll: float | None,
    listen_dsn: str | None,
    timeout: float | None,
    grace: float,
    backoff: float,
    reap_every: float,
    dead_after: int,
    no_reap: bool,
    archive_after: float,
    no_archive: bool,
    no_schedules: bool,
    catch_up: str,
    heartbeat: float,
    burst: bool,
    max_jobs: int | None,
    allow_shell: bool,
    handlers: tuple[tuple[str, tuple[str, ...]], ...],
    serve: tuple[tuple[str, tuple[str, ...]], ...],
    max_jobs_per_process: int | None,
    sql_handlers: tuple[tuple[str, str], ...],
    policy_file: str | None,
    handlers_only: bool,
    allow_programs: tuple[str, ...],
    allow_env: tuple[str, ...],
    max_payload_bytes: int,
    log_format: str,
    log_output_lines: int,
    log_output_bytes: int,
    keep_output: int,
    history: bool,
) -> int:
    """Run jobs: claim them, run each as a child process, record how it ended.

    A payload {"argv": [...]} runs that program directly; {"shell": "..."}
    needs --allow-shell; with --handler KIND=COMMAND, jobs of KIND run
    COMMAND with their payload as JSON on stdin; with --sql KIND=STATEMENT,
    jobs of KIND run STATEMENT ($1: the payload) and are marked done in the
    same transaction, no process started; with --serve KIND=COMMAND,
    COMMAND is started once per slot and kept running, and each job of KIND
    is a JSON line on its stdin answered by a line on its stdout. A policy (--policy FILE,
    --handlers-only, --allow-program, --allow-env) narrows what may run: a
    job it refuses fails at once, saying which rule refused it. Exit 0: done; anything
    else: retried with exponential backoff until max_attempts, then failed.
    The child gets PGQCTL_JOB_ID (an idempotency key), PGQCTL_JOB_KIND,
    PGQCTL_JOB_QUEUE, PGQCTL_JOB_ATTEMPT, and PGQCTL_JOB_CLAIM and
    PGQCTL_JOB_SCHEMA (to mark its job done in its own transaction:
    pgqctl.complete_job), and no database credentials.

    Every --reap-every, the worker also returns jobs whose lease expired (a
    worker that died holding them) to the queue, as `pgqctl reap` does, so a
    fleet needs no cron for it; many workers reaping at once take each job
    once, and never one of a live worker (its lease is renewed). The jobs of
    a worker silent for --dead-after of its heartbeats (killed, its host
    gone) come back then too, without waiting for their leases.

    Workers also enqueue the ticks of the schedules (`pgqctl schedule`): any
    worker may, at most once a second, and the database keeps each tick to
    one job however many try. A --burst worker enqueues the due ticks once,
    when it starts.

    Each worker registers itself in `pgqctl workers` (host, pid, queues,
    what it runs) and heartbeats there every --heartbeat, on the exchanges
    it makes anyway; a clean stop removes its row. Its connections are
    named `pgqctl worker HOST:PID` in pg_stat_activity.

    SIGTERM, SIGINT or SIGHUP: claim nothing more, let running jobs finish for
    --grace, then stop them and hand them back; a second signal stops them
    at once. Logs one line per job event on stderr.

    A DURATION is a number with a unit, ms, s, m, h, d or w (30s, 1h30m),
    or a number of seconds.

    \b
    Example:
        pgqctl worker --concurrency 8
        pgqctl worker --concurrency 4 --prefetch 4
        pgqctl worker --queue emails --handler 'send_receipt=bin/send-receipt' --burst
        pgqctl worker --sql 'create_invoice=CALL create_invoice($1)'
        pgqctl worker --serve 'thumbnail=python3 thumbnails.py' --concurrency 4
        pgqctl worker --kind report --timeout 10m --log-format json
        pgqctl worker --policy /etc/pgqctl/policy.toml
        pgqctl worker --allow-program /usr/local/lib/jobs/ --handler 'mail=/usr/bin/mailer'
    """
    from pgqctl import policy, worker

    both = sorted({kind for kind, _ in handlers} & {kind for kind, _ in sql_handlers})
    if both:
        raise click.BadParameter(
            f"kind {both[0]!r} has both a --handler and a --sql: give it one of them",
            param_hint="'--sql'",
        )
    rules = policy.read_policy(policy_file) if policy_file is not None else None
    rules = policy.with_flags(
        rules, handlers_only=handlers_only, programs=allow_programs, allow_env=allow_env
    )

    config = worker.WorkerConfig(
        schema=database.schema,
        queues=queues,
        kinds=kinds,
        concurrency=concurrency,
        prefetch=prefetch,
        lease=lease,
        poll=poll,
        timeout=timeout,
        grace=grace,
        burst=burst,
        max_jobs=max_jobs,
        allow_shell=allow_shell,
        handlers=handlers,
        sql_handlers=sql_handlers,
        serve=serve,
        max_jobs_per_process=max_jobs_per_process,
        backoff=backoff,
        listen_dsn=listen_dsn,
        reap_every=None if no_reap else reap_every,
        dead_after=dead_after,
        archive_after=None if no_archive else archive_after,
        schedules=not no_schedules,
        catch_up=catch_up,
        heartbeat=heartbeat,
        policy=rules,
        log_output_lines=log_output_lines,
        log_output_bytes=log_output_bytes,
        history=history,
        keep_output=keep_output,
        max_payload_bytes=max_payload_bytes,
        timeouts=database.timeouts,
    )
    log = WorkLog(sys.stderr, log_format, debug=debugging())
    warn_of_password_on_command_line(log, database.dsn_option, listen_dsn)
    warn_of_unknown_queues(log, database, queues)
    return worker.serve(config, database.dsn, log)


def warn_of_unknown_queues(log: WorkLog, database: Database, queues: tuple[str, ...]) -> None:
    """Once, at start: a --queue that has never had a job nor a pause is
    most likely a typo, and the worker would sit idle beside a backlog. It
    still serves it (the first jobs of a new queue may be on their way)."""
    if not queues:
        return
    import psycopg

    from pgqctl import control
    from pgqctl.errors import PgqctlError

    try:
        with database.connect() as conn:
            unknown = control.unknown_queues(conn, queues)
    except (psycopg.Error, PgqctlError):
        return  # the worker's own start says what is wrong, and retries
    for queue in unknown:
        log.event(
            "unknown_queue",
            f"{queue.message()} (serving it anyway: its first jobs may be on their way)",
            queue=queue.queue,
            close=queue.close,
        )


def warn_of_password_on_command_line(
    log: WorkLog, dsn_option: str | None, listen_dsn: str | None
) -> None:
    """Once: a password in --dsn or --listen-dsn given on the command line
    is in /proc/PID/cmdline, which every process on the host may read, the
    worker's jobs included (the same options read from PGQCTL_* are not)."""
    from click.core import ParameterSource

    from pgqctl.hardening import password_in

    ctx = click.get_current_context()

    def typed(name: str) -> bool:  # before the command (the group's) or after it
        return any(
            c.get_parameter_source(name) is ParameterSource.COMMANDLINE
            for c in (ctx, ctx.find_root())
        )

    flags = [
        flag
        for flag, name, value in (
            ("--dsn", "dsn", dsn_option),
            ("--listen-dsn", "listen_dsn", listen_dsn),
        )
        if value and typed(name) and password_in(value)
    ]
    if flags:
        log.event(
            "password_on_command_line",
            f"the password in {' and '.join(flags)} can be read by every process on this host, "
            "this worker's jobs included (ps, /proc/PID/cmdline): give it in PGQCTL_DSN, "
            "a passfile (~/.pgpass) or a service file (PGSERVICEFILE) instead",
            options=flags,
        )
