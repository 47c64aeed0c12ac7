"""What a worker does, as its options say (`WorkerConfig`), and the settings
and timings every part of it shares: the connections' settings, backoff,
reconnect delays, its name in the logs and in pg_stat_activity."""

from __future__ import annotations

import functools
import os
import random
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pgqctl import leases, limits, runner
from pgqctl.blockers import Timeouts
from pgqctl.errors import BadInput
from pgqctl.history import ARCHIVE_AFTER
from pgqctl.policy import Policy
from pgqctl.schedules import CATCH_UP
from pgqctl.worklog import KEEP_OUTPUT_BYTES, LOG_OUTPUT_BYTES, LOG_OUTPUT_LINES

CHANNEL = "pgqctl_jobs"
CANCEL_CHANNEL = "pgqctl_cancel"
SCHEDULES_CHANNEL = "pgqctl_schedules"
LIMITS_CHANNEL = "pgqctl_limits"
APPLICATION_NAME = "pgqctl worker"
# PostgreSQL keeps this many bytes of an application_name (NAMEDATALEN - 1).
APPLICATION_NAME_BYTES = 63
# Looking for jobs without a notification: every POLL_LISTENING seconds as a
# safety net, or every POLL_DEAF when notifications cannot be heard.
POLL_LISTENING = 5.0
POLL_DEAF = 1.0

# Set in every transaction of the worker's connections (never for the
# session: a pooler would hand them to other clients). The timeouts bound
# how long a statement may block the loop: a table locked by an operator, or
# a stuck server, ends in an error and a retry, not a hang. Generic plans:
# the exchange statement runs thousands of times a second, and planning it
# afresh each time (what PostgreSQL's default ends up doing for it) costs
# several times more than running it; its SQL is written so that the one
# cached plan stays right (see worker_exchange). Without prepared statements
# (behind a pooler) the setting has no effect.
# The defaults of worker --lock-timeout and --statement-timeout.
TIMEOUTS = Timeouts(lock=10.0, statement=30.0)
SESSION_SETTINGS = {
    **TIMEOUTS.settings(),
    "plan_cache_mode": "force_generic_plan",
    # JIT is off on every pgqctl connection (db.BASE_SETTINGS): a plan whose
    # estimate grows with a backlog would turn it on for every run.
}
# Retry delays: attempt n waits base * 2^(n-1), +-25% jitter, at most this.
BACKOFF_CAP = 3600.0
# Reconnects wait 0.5 s, doubling to 10 s, +-25% jitter: back within
# about 12 s of the server's return, well before the fleet's reaps would
# take a worker silent since the restart for dead (30 s by default).
RECONNECT_FIRST = 0.5
RECONNECT_CAP = 10.0
HEARTBEAT = 5.0
# A child asked to stop (timeout, shutdown, lost lease) gets SIGTERM, then
# SIGKILL this many seconds later.
TERM_GRACE = 5.0
# While stopping, how long to keep trying to reach the database to report
# finished jobs once no child runs any more.
REPORT_WAIT = 10.0

# libpq parameters for the worker's connections: the loop waits on the main
# one, so a dead peer or a network cut must end in an error within about half
# a minute, not in TCP's quarter of an hour (ignored on unix sockets).
CONNECTION_PARAMS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,  # ms
}


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker does, as its options say; checks itself (BadInput)."""

    schema: str = "public"
    queues: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    concurrency: int = 1
    lease: float = 300.0
    # None: every POLL_LISTENING seconds, or POLL_DEAF when notifications
    # cannot be heard (a transaction pooler).
    poll: float | None = None
    timeout: float | None = None
    grace: float = 30.0
    burst: bool = False
    max_jobs: int | None = None
    allow_shell: bool = False
    # (KIND, command) pairs, as --handler gives them: a kind may appear once.
    handlers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # --sql KIND=STATEMENT: the kinds whose work is one statement, run with
    # the job's "done" in one transaction (pgqctl/sql_jobs.py).
    sql_handlers: tuple[tuple[str, str], ...] = ()
    # --serve KIND=COMMAND: the kinds whose COMMAND is started once and fed
    # their jobs as lines (pgqctl/resident.py), and how many jobs a process
    # takes before it is retired (None: no limit).
    serve: tuple[tuple[str, tuple[str, ...]], ...] = ()
    max_jobs_per_process: int | None = None
    backoff: float = 2.0
    # A direct (or session-pooled) connection used only to LISTEN, when the
    # DSN goes through a transaction pooler.
    listen_dsn: str | None = None
    # Reclaim expired leases about this often (+-25%); None: never (cron does).
    reap_every: float | None = 30.0
    # And the jobs of workers silent for this many of their heartbeats.
    dead_after: int = leases.DEAD_AFTER
    # Move jobs finished this long ago from jobs into the history
    # (pgqctl/history.py); None: never.
    archive_after: float | None = ARCHIVE_AFTER
    # Enqueue the schedules' due ticks (pgqctl/ticks.py); and what becomes of
    # ticks missed while no worker ran (schedules.CATCH_UP).
    schedules: bool = True
    catch_up: str = "latest"
    # Heartbeat in `workers` at least this often: shown stale after three
    # missed (15 s), dead after --dead-after (30 s), when any worker's next
    # heartbeat finds it dead and its reap takes the jobs at once.
    heartbeat: float = HEARTBEAT
    # Jobs claimed ahead of a free slot, kept in a local queue (see Worker).
    prefetch: int = 0
    # What jobs may run (pgqctl/policy.py); None: anything. The [handlers]
    # of its file add to `handlers`.
    policy: Policy | None = None
    # How much of each job's output the log takes: its first lines, up to
    # this many bytes in all; a line at the job's end says what was left out.
    log_output_lines: int = LOG_OUTPUT_LINES
    log_output_bytes: int = LOG_OUTPUT_BYTES
    # Record each attempt in `attempts` (what `show` and `logs` read), with
    # up to this many bytes of each of its streams (half its first, half its last).
    history: bool = True
    keep_output: int = KEEP_OUTPUT_BYTES
    # A claimed job with a longer payload (JSON text, UTF-8) fails for good.
    max_payload_bytes: int = limits.MAX_PAYLOAD_BYTES
    # How long a statement may wait for a lock, and run (--lock-timeout...).
    timeouts: Timeouts = TIMEOUTS

    def __post_init__(self) -> None:
        if self.prefetch < 0:
            raise BadInput(
                "--prefetch must be 0 or more, e.g. --prefetch 4 (0: claim no jobs ahead)"
            )
        if self.lease < 1:
            raise BadInput("--lease must be at least 1s (it is renewed every third of it)")
        if self.poll is not None and self.poll <= 0:
            raise BadInput("--poll must be more than 0s, e.g. --poll 5s")
        if self.reap_every is not None and self.reap_every <= 0:
            raise BadInput(
                "--reap-every must be more than 0s, e.g. --reap-every 30s (or --no-reap)"
            )
        leases.check_dead_after(self.dead_after)
        if self.archive_after is not None and self.archive_after < 0:
            raise BadInput(
                "--archive-after must be 0s or more, e.g. --archive-after 10m (or --no-archive)"
            )
        if self.heartbeat <= 0:
            raise BadInput("--heartbeat must be more than 0s, e.g. --heartbeat 5s")
        if self.timeout is not None and self.timeout <= 0:
            raise BadInput("--timeout must be more than 0s; leave it out for no limit")
        if self.catch_up not in CATCH_UP:
            raise BadInput(f"--catch-up takes one of {', '.join(CATCH_UP)}")
        kinds = [kind for kind, _ in self.handlers]
        for kind in kinds:
            if kinds.count(kind) > 1:
                raise BadInput(f"--handler given twice for kind {kind!r}: keep one")
        served = [kind for kind, _ in self.serve]
        for kind in served:
            if served.count(kind) > 1:
                raise BadInput(f"--serve given twice for kind {kind!r}: keep one")
            if kind in kinds or kind in dict(self.sql_handlers):
                raise BadInput(
                    f"kind {kind!r} has a --serve and a --handler or --sql: give it one of them"
                )
        if self.max_jobs_per_process is not None and self.max_jobs_per_process < 1:
            raise BadInput("--max-jobs-per-process must be at least 1")
        if self.policy is not None:
            for kind, _ in self.policy.handlers:
                if kind in kinds:
                    raise BadInput(
                        f"kind {kind!r} has a handler in {self.policy.source} and a "
                        "--handler: keep one"
                    )
            # The programs handlers run are the operator's, checked once here.
            self.policy.check_handlers([*self.handler_map.items(), *self.serve], os.environ)

    @functools.cached_property
    def handler_map(self) -> Mapping[str, tuple[str, ...]]:
        """The command of each kind that has a handler (--handler, or the policy file's)."""
        return dict((*(self.policy.handlers if self.policy else ()), *self.handlers))


def make_room_for(concurrency: int) -> None:
    """Make room for `concurrency` jobs under the open-file limit: raise the
    soft limit (up to the hard one) if need be, or refuse. Without it, jobs
    would fail to start one by one ("too many open files"), each losing an
    attempt. (Jobs inherit the raised soft limit.)"""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = runner.open_files_needed(concurrency)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard != resource.RLIM_INFINITY and need > hard:
        raise BadInput(
            f"--concurrency {concurrency} needs up to {need} open files and the hard "
            f"limit is {hard}: raise it (ulimit -Hn, LimitNOFILE= in systemd) "
            "or lower --concurrency"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def backoff_delay(attempt: int, base: float) -> float:
    """Seconds before a job whose attempt `attempt` failed runs again."""
    return min(jittered(base * 2.0 ** min(attempt - 1, 32)), BACKOFF_CAP)


def jittered(delay: float) -> float:
    return delay * random.uniform(0.75, 1.25)


def identity() -> str:
    """This worker in the logs, in `workers` and in `locked_by` (there
    followed by :slot): host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def application_name(worker: str) -> str:
    """`pgqctl worker host:pid`, within the bytes PostgreSQL keeps: a host
    too long loses its domain's labels from the end, then its own end; the
    pid always stays."""
    host, _, pid = worker.rpartition(":")
    room = APPLICATION_NAME_BYTES - len(f"{APPLICATION_NAME} :{pid}")
    if len(host.encode()) > room:
        labels = host.split(".")
        while len(labels) > 1 and len(".".join(labels).encode()) > room:
            labels.pop()
        host = ".".join(labels).encode()[: max(room, 0)].decode("utf-8", "ignore")
    return f"{APPLICATION_NAME} {host}:{pid}"


def output_keep(config: WorkerConfig) -> runner.OutputKeep:
    """What of each stream of a job's output the attempt history keeps."""
    if not config.history:
        return runner.NO_KEEP
    head = config.keep_output // 2
    return runner.OutputKeep(head, config.keep_output - head)
