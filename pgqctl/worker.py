"""`pgqctl worker`: claim jobs, run each as a child process, report how it ended.

Threads, and who owns what:

- The main thread runs the loop (`Worker.run`). It alone uses the main
  connection: it claims jobs for the free slots, reports finished jobs,
  renews leases, and handles signals and reconnects. Everything that ended
  since the last time, the lease renewal when due and the next claim go out
  as one statement (`claims.exchange`): one round trip, one commit.
- The children of the claimed jobs (`runner.Supervisor`) are started and
  watched by the main thread too, where it waits: their output, timeouts,
  stop requests and exits, in the same poll() as everything else. No
  transaction is open meanwhile. When the main thread is away for more than
  a tenth of a second (a slow statement, a reconnect), the supervisor's own
  thread stands in for it, so that a timeout or a job's output never waits
  on the database. Not a thread per slot, and not a thread of their own in
  the common case: thread switches per job cost a busy worker more than the
  children themselves (about 10% of its CPU per job of `true`).
- A listener thread holds a second connection in ``LISTEN pgqctl_jobs`` (the
  main one stays free for queries) and hands each notification to the
  handler of its channel (`_on_notification`), which posts an event: for
  ``pgqctl_jobs``, a wake-up when it is about this schema; for
  ``pgqctl_cancel``, the jobs an operator cancelled (`pgqctl cancel`).
- Every --reap-every the loop also reclaims expired leases (`admin.reap`,
  the statement `pgqctl reap` runs), so a fleet without cron still gets a
  dead worker's jobs back; its own leases are live (renewed first). It
  then removes the rows of workers gone for an hour from `workers`.
- The worker registers itself in `workers` with its first exchange, and
  heartbeats there at least every --heartbeat: in the pipeline of an
  exchange when one goes out (no round trip of its own), alone otherwise
  (`claims.Beat`). A clean stop removes its row.
- When a schedule's tick is due (at most once a second), the loop enqueues
  the due ticks of every schedule in one statement (`ticks.Ticker`, which
  keeps the schedules read from the database; a notification on
  ``pgqctl_schedules`` has it read them again). The database keeps each
  tick to one job, so every worker may do it; --no-schedules leaves it to
  the others.

Everything reaches the main thread through one queue, `events`, so the loop
waits in one place (watching the children), until an event or the nearest
deadline: lease renewal, poll, the next delayed job, the end of the grace
period, a reconnect. It never spins. Other threads and signal handlers post
to that queue and wake the wait (`_post`); the loop decides what to do.

State of a job held by this worker: claimed and running in a slot (in
`running`), then finished and waiting to be reported (in the report lists),
then reported. With --prefetch N, up to N more are claimed ahead of a free
slot and wait in `prefetched` (a local FIFO, in claim order; locked_by
host:pid:prefetch), their leases renewed with the running ones'; each starts
as soon as a slot frees, and the next exchange moves its locked_by to the
slot (through the renewal) and claims its replacement. A graceful stop
hands them back at once (the attempt not counted); a cancel or a lost lease
drops them unstarted; a crash leaves them to reap.

A lease found lost (renewal or fenced report matched nothing) stops the
child if it still runs and drops its result. So does a cancel: the
operator's cancel has already ended the job in the database (status
cancelled, fenced like a report); a notification names it at once, and the
renewal finds it otherwise. Either way the worker reads the job's row before
it stops anything (anyone connected may send a notification), and logs
`cancelled`, not a lost lease.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import functools
import json
import logging
import os
import queue
import random
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import FrameType
from typing import Any

import psycopg

from pgqctl import (
    __version__,
    admin,
    claims,
    db,
    hardening,
    limits,
    payload,
    runner,
    sql_jobs,
    ticks,
)
from pgqctl.blockers import Blocker, Timeouts, find_blocker, spelled, timeout_kind, waited
from pgqctl.claims import Failure
from pgqctl.config import describe
from pgqctl.db import reason
from pgqctl.errors import BadInput, PgqctlError, PrivilegeMissing, ReadOnlyServer
from pgqctl.guard import Guard
from pgqctl.jobs import Held, Job
from pgqctl.policy import Policy
from pgqctl.rows import Unreadable
from pgqctl.schedules import CATCH_UP
from pgqctl.sql import query
from pgqctl.worklog import LOG_OUTPUT_BYTES, LOG_OUTPUT_LINES, WorkLog, seconds, timestamp

CHANNEL = "pgqctl_jobs"
CANCEL_CHANNEL = "pgqctl_cancel"
SCHEDULES_CHANNEL = "pgqctl_schedules"
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
    # No statement of the worker's gains from JIT compilation, and a plan
    # whose estimate grows with a backlog would turn it on for every run.
    "jit": "off",
}
# Retry delays: attempt n waits base * 2^(n-1), +-25% jitter, at most this.
BACKOFF_CAP = 3600.0
# Reconnects wait 0.5 s, doubling to 30 s, +-25% jitter.
RECONNECT_FIRST = 0.5
RECONNECT_CAP = 30.0
# A child asked to stop (timeout, shutdown, lost lease) gets SIGTERM, then
# SIGKILL this many seconds later.
TERM_GRACE = 5.0
# While stopping, how long to keep trying to reach the database to report
# finished jobs once no child runs any more.
REPORT_WAIT = 10.0
# The loop wakes at least this often even with nothing to do.
_IDLE_CAP = 60.0
_HAND_BACK_REASON = "handed back: the worker stopped before the job finished"

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
_WAKE = "wake"
_DEAF = "deaf"  # the listener cannot hear notifications (now)
_HEARING = "hearing"  # the listener hears them
_SCHEDULES = "schedules"  # the schedules changed


@dataclass(frozen=True)
class _CancelNotice:
    """A notification that an operator cancelled these (job id, attempt)s."""

    held: frozenset[Held]


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
    backoff: float = 2.0
    # A direct (or session-pooled) connection used only to LISTEN, when the
    # DSN goes through a transaction pooler.
    listen_dsn: str | None = None
    # Reclaim expired leases about this often (+-25%); None: never (cron does).
    reap_every: float | None = 30.0
    # And the jobs of workers silent for this many of their heartbeats.
    dead_after: int = admin.DEAD_AFTER
    # Enqueue the schedules' due ticks (pgqctl/ticks.py); and what becomes of
    # ticks missed while no worker ran (schedules.CATCH_UP).
    schedules: bool = True
    catch_up: str = "latest"
    # Heartbeat in `workers` at least this often.
    heartbeat: float = 10.0
    # Jobs claimed ahead of a free slot, kept in a local queue (see Worker).
    prefetch: int = 0
    # What jobs may run (pgqctl/policy.py); None: anything. The [handlers]
    # of its file add to `handlers`.
    policy: Policy | None = None
    # How much of each job's output the log takes: its first lines, up to
    # this many bytes in all; a line at the job's end says what was left out.
    log_output_lines: int = LOG_OUTPUT_LINES
    log_output_bytes: int = LOG_OUTPUT_BYTES
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
        admin.check_dead_after(self.dead_after)
        if self.heartbeat <= 0:
            raise BadInput("--heartbeat must be more than 0s, e.g. --heartbeat 10s")
        if self.timeout is not None and self.timeout <= 0:
            raise BadInput("--timeout must be more than 0s; leave it out for no limit")
        if self.catch_up not in CATCH_UP:
            raise BadInput(f"--catch-up takes one of {', '.join(CATCH_UP)}")
        kinds = [kind for kind, _ in self.handlers]
        for kind in kinds:
            if kinds.count(kind) > 1:
                raise BadInput(f"--handler given twice for kind {kind!r}: keep one")
        if self.policy is not None:
            for kind, _ in self.policy.handlers:
                if kind in kinds:
                    raise BadInput(
                        f"kind {kind!r} has a handler in {self.policy.source} and a "
                        "--handler: keep one"
                    )
            # The programs handlers run are the operator's, checked once here.
            self.policy.check_handlers(self.handler_map.items(), os.environ)

    @functools.cached_property
    def handler_map(self) -> Mapping[str, tuple[str, ...]]:
        """The command of each kind that has a handler (--handler, or the policy file's)."""
        return dict((*(self.policy.handlers if self.policy else ()), *self.handlers))


def serve(config: WorkerConfig, target: Callable[[], str], log: WorkLog) -> int:
    """Connect to the DSN `target()` gives, check the schema, and work until
    told to stop; the exit code.

    Raises BadInput for a --concurrency the open-file limit cannot serve
    (before anything else), and DatabaseUnavailable or NotMigrated when it
    cannot start.
    """
    if not hardening.make_undumpable() and sys.platform.startswith("linux"):
        log.event(
            "jobs_can_read_worker",
            "cannot close this worker's environment and memory to its jobs (prctl "
            "PR_SET_DUMPABLE refused): jobs running as this user may read its database "
            "password; run them as another user (see docs/operating.md, Jobs and the database "
            "password)",
        )
    make_room_for(config.concurrency)
    dsn = target()
    # pg_stat_activity tells each worker's connections from the others'.
    name = application_name(identity())
    # psycopg logs a lost connection inside a pipeline with Python's last-resort
    # handler (a bare stderr line); the worker logs that event itself.
    logging.getLogger("psycopg").addHandler(logging.NullHandler())

    def connect() -> db.QueueConnection:
        return db.open_queue(
            dsn,
            schema=config.schema,
            writes=True,
            migrated=False,
            application_name=name,
            settings={**SESSION_SETTINGS, **config.timeouts.settings()},
            **CONNECTION_PARAMS,
        )

    listen_dsn = config.listen_dsn or dsn

    def listen_connect() -> db.QueueConnection:
        return db.connect(
            listen_dsn,
            schema=config.schema,
            application_name=name,
            **CONNECTION_PARAMS,
        )

    conn = connect()
    try:
        db.require_migrated(conn)
    except BaseException:
        conn.close()
        raise
    worker = Worker(
        config,
        connect,
        log,
        listen_connect=listen_connect,
        describe_target=describe(dsn),
        describe_listen_target=describe(listen_dsn),
        find_blocker=functools.partial(find_blocker, dsn, schema=config.schema),
    )
    try:
        worker.check(conn)
    except BaseException:
        conn.close()
        raise
    return worker.run(conn)


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


def _insufficient_resources(exc: BaseException) -> bool:
    """SQLSTATE class 53 (disk_full, out_of_memory, too_many_connections...):
    the server answered, and said no for want of a resource. psycopg's
    classes for them do not all derive from InsufficientResources."""
    return isinstance(exc, psycopg.Error) and (exc.sqlstate or "").startswith("53")


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


@dataclass(eq=False)
class _Running:
    """A job claimed by this worker whose child has not been reported on."""

    job: Job
    stop: runner.Stop
    slot: int = -1  # which of the --concurrency slots it holds, for the logs
    lost: bool = False  # lease lost: stop the child, drop its result
    # Done by the job's own transaction (pgqctl_complete_job): nothing to
    # renew or report; its program runs on until it exits.
    completed: bool = False
    prefetched: bool = False  # claimed ahead of a free slot, and not started yet

    @property
    def holds_lease(self) -> bool:
        return not (self.lost or self.completed)


@dataclass(frozen=True)
class _Finished:
    """A slot's result: the child's outcome, or why the payload can never run."""

    running: _Running
    outcome: runner.Outcome
    rejected: str | None = None
    # A SQL job's end (pgqctl/sql_jobs.py): done in its own transaction, or
    # found no longer running (nothing committed). Nothing left to report.
    committed: bool = False
    fenced_out: bool = False


class Worker:
    def __init__(
        self,
        config: WorkerConfig,
        connect: Callable[[], db.QueueConnection],
        log: WorkLog,
        *,
        listen_connect: Callable[[], db.QueueConnection] | None = None,
        environ: Mapping[str, str] | None = None,
        describe_target: str = "",
        describe_listen_target: str = "",
        find_blocker: Callable[..., Blocker | None] | None = None,
    ) -> None:
        self.config = config
        self.connect = connect
        # Who holds the lock a statement gave up on (find_blocker's
        # keywords `waited` and `ours`).
        self.find_blocker = find_blocker or (lambda **_: None)
        self.listen_connect = listen_connect or connect
        self.log = log
        self.worker_id = identity()
        # The worker's row in `workers`; its counters change with each heartbeat.
        self.beat = claims.Beat(
            id=self.worker_id,
            host=self.worker_id.rpartition(":")[0],
            pid=os.getpid(),
            version=__version__,
            queues=tuple(dict.fromkeys(config.queues)),
            kinds=tuple(dict.fromkeys(config.kinds)),
            concurrency=config.concurrency,
            heartbeat=config.heartbeat,
            lease=config.lease,
        )
        self.jobs_done = 0
        self.jobs_failed = 0
        self.started_at: dt.datetime | None = None  # None until registered
        self.target = describe_target
        self.listen_target = describe_listen_target or describe_target or "the database"
        # Taken and cleaned once: reading os.environ decodes every variable again.
        self.environ = payload.without_credentials(os.environ if environ is None else environ)
        self.events: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.exit_code = 0
        self.output_cap = runner.OutputCap(config.log_output_lines, config.log_output_bytes)

        self._children: runner.Supervisor | None = None
        self._sql = (
            sql_jobs.SqlJobs(
                dict(config.sql_handlers),
                connect,
                on_started=self._sql_started,
                on_done=self._sql_done,
                keep=config.concurrency,
            )
            if config.sql_handlers
            else None
        )
        self._guard: Guard | None = None
        # Free slot numbers, lowest on top: the logs say which slot runs a job.
        self._free_slots = list(range(config.concurrency - 1, -1, -1))
        self._listener: threading.Thread | None = None
        # What each channel the listener hears means (see _on_notification).
        self._channel_handlers: dict[str, Callable[[str], None]] = {
            CHANNEL: self._on_jobs_notified,
            CANCEL_CHANNEL: self._on_cancel_notified,
            SCHEDULES_CHANNEL: self._on_schedules_notified,
        }
        self._closing = threading.Event()
        self._closing_r, self._closing_w = os.pipe()

        self.conn: db.QueueConnection | None = None
        # Often, until the listener hears notifications.
        self.poll = POLL_DEAF if config.poll is None else config.poll
        self.read_only = False  # the server refuses our writes for good (a standby)
        self.running: dict[Held, _Running] = {}
        self.done: list[_Finished] = []
        # Jobs whose "done" report was sent on an exchange that failed: if
        # their rows say done, that may be our report's doing, not the job's.
        self.maybe_reported: set[Held] = set()
        self.fails: list[tuple[_Finished, Failure]] = []
        self.handed_back: list[_Finished] = []
        # Jobs claimed ahead of a free slot (--prefetch), in claim order: each
        # starts as soon as a slot frees. Their leases are renewed with the
        # running ones'.
        self.prefetched: collections.deque[_Running] = collections.deque()
        # Prefetched jobs started since the last exchange, with their slot:
        # the next one moves their locked_by from :prefetch to the slot.
        self.slotted: dict[Held, int] = {}
        # Held jobs a notification says were cancelled: checked, then stopped.
        self.cancel_notices: set[Held] = set()
        self.claimed = 0
        self.floors = claims.Floors(enabled=not config.queues and not config.kinds)

        now = time.monotonic()
        self.claim_wanted = True
        self.last_claim_short = False
        self.next_poll = now
        self.next_due: float | None = None
        self.next_renew = now
        self.next_reap = now + jittered(config.reap_every or 0.0)
        self.next_heartbeat = now  # registers with the first exchange
        # A --burst worker reaps once more before it decides nothing is due.
        self.burst_reaped = False
        self.ticker = ticks.Ticker(config.catch_up) if config.schedules else None
        # A --burst worker enqueues due ticks once, when it starts.
        self.burst_ticked = False
        self.reconnect_delay = RECONNECT_FIRST
        self.reconnect_at = now
        self.lost_since: float | None = None
        # The server refused for want of a resource (disk full...): no
        # exchange before refused_until, refused_delay longer each time.
        self.refused_until = 0.0
        self.refused_delay = RECONNECT_FIRST

        self.signals = 0
        self.stopping = False
        self.stop_now = False
        self.children_stopped = False
        self.grace_deadline = 0.0
        self.report_deadline: float | None = None
        self.guard_lost_logged = False

    # ------------------------------------------------------------- lifecycle

    def check(self, conn: db.QueueConnection) -> None:
        """Refuse to start (BadInput) with what no job could ever run: a
        --sql statement the server cannot prepare, or of the wrong parameters."""
        if self._sql is not None:
            self._sql.check(conn)

    def run(self, conn: db.QueueConnection) -> int:
        """Work until told to stop (or, with burst/max-jobs, until done); the exit code."""
        self.conn = conn
        self._log_start()
        previous = self._install_signal_handlers()
        self._start_threads()
        try:
            while True:
                try:
                    self._act()
                    if self._should_exit():
                        break
                    self._wait()
                except Exception as exc:  # the loop must survive anything
                    self.log.error("unexpected error in the worker loop", exc)
                    self._drop_connection()
        finally:
            # Signals stay ours until the end: one arriving while the threads
            # stop must not kill a worker that is stopping cleanly.
            self._stop_threads()
            if self.conn is not None:
                self._unregister()
                self.conn.close()
            if self._sql is not None:
                self._sql.close()
            self._restore_signal_handlers(previous)
        self.log.event(
            "worker_stopped",
            f"worker {self.worker_id} stopped after {self.claimed} job(s)",
            jobs=self.claimed,
            exit_code=self.exit_code,
        )
        return self.exit_code

    def _log_start(self) -> None:
        c = self.config
        self.log.event(
            "worker_started",
            f"worker {self.worker_id} started: {c.concurrency} slot(s), "
            + (f"prefetch {c.prefetch}, " if c.prefetch else "")
            + f"queues {', '.join(c.queues) or 'all'}, kinds {', '.join(c.kinds) or 'all'}, "
            f"lease {seconds(c.lease)}, poll {seconds(c.poll or POLL_LISTENING)}, "
            + (
                f"reap every {seconds(c.reap_every)} (dead after {c.dead_after} heartbeats)"
                if c.reap_every
                else "no reap"
            )
            + (f", schedules (catch-up {c.catch_up})" if c.schedules else ", no schedules")
            + f", heartbeat {seconds(c.heartbeat)}"
            + (f", policy {c.policy.name}" if c.policy else "")
            + (f", database {self.target}" if self.target else ""),
            worker=self.worker_id,
            concurrency=c.concurrency,
            prefetch=c.prefetch,
            queues=list(c.queues),
            kinds=list(c.kinds),
            lease=c.lease,
            poll=c.poll or POLL_LISTENING,
            reap_every=c.reap_every,
            dead_after=c.dead_after,
            schedules=c.schedules,
            catch_up=c.catch_up,
            heartbeat=c.heartbeat,
            schema=c.schema,
            policy=c.policy.name if c.policy else None,
        )

    def _start_threads(self) -> None:
        try:
            self._guard = Guard(TERM_GRACE, self.log.format, self.environ)
        except OSError as exc:
            self.log.error("cannot start the guard that stops jobs if this worker dies", exc)
        self._children = runner.Supervisor(
            self._child_done,
            on_start=self._child_started,
            term_grace=TERM_GRACE,
            guard=self._guard,
        )
        self._listener = threading.Thread(target=self._listen, name="pgqctl-listen", daemon=True)
        self._listener.start()

    def _stop_threads(self) -> None:
        self._closing.set()
        os.write(self._closing_w, b"x")
        if self._children is not None:
            self._children.close(timeout=TERM_GRACE + 1)
        if self._guard is not None:
            self._guard.close(timeout=TERM_GRACE + 1)
        if self._listener is not None:
            self._listener.join(timeout=2)
        if not self._listener or not self._listener.is_alive():
            os.close(self._closing_r)
            os.close(self._closing_w)

    def _install_signal_handlers(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            # A hang-up (the terminal closed) stops the worker as SIGTERM
            # does, unless it was told to ignore it (nohup).
            if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
                continue
            previous[signum] = signal.signal(signum, self._on_signal_handler)
        if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
            # Inherited from a parent: the kernel would reap our children
            # itself, and no job's exit status could be read.
            previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        return previous

    def _restore_signal_handlers(self, previous: dict[int, Any]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def _on_signal_handler(self, signum: int, frame: FrameType | None) -> None:
        # Only post it: the loop acts on it (SimpleQueue.put is reentrant).
        self._post(signum)

    def _post(self, event: object) -> None:
        """An event from another thread (or a signal handler): the loop may be
        watching the children, so wake it too."""
        self.events.put(event)
        if self._children is not None:
            self._children.wake()

    # ------------------------------------------------------------- the loop

    def _act(self) -> None:
        """Do whatever is due now: stop children, reconnect, report, renew, claim."""
        now = time.monotonic()
        if self._children is not None and self._children.failure is not None:
            self._supervisor_failed(self._children.failure)
        if self._guard is not None and self._guard.lost and not self.guard_lost_logged:
            self.guard_lost_logged = True
            self.log.event(
                "guard_lost",
                f"guard process {self._guard.pid} is gone (killed, or stopped and given up): "
                "if this worker dies now, its jobs run on; restart the worker to get one back",
                guard_pid=self._guard.pid,
            )
        if (
            self.stopping
            and not self.children_stopped
            and (self.stop_now or now >= self.grace_deadline)
        ):
            self._stop_children()
        if self.conn is None and (
            self.read_only or now < self.reconnect_at or not self._reconnect()
        ):
            return
        if now < self.refused_until:
            return
        if self.cancel_notices:
            self._check_cancel_notices()
            if self.conn is None:
                return
        if self._tick_due():
            self._tick()
            if self.conn is None:
                return
        limit = self._claim_limit() if self._claim_due(now) else 0
        if now >= self.next_heartbeat + (admin.STALE_AFTER - 1) * self.config.heartbeat:
            # Silent for three heartbeats (stopped, suspended, starved): a
            # reap may have taken our jobs as a dead worker's. Renewing now
            # tells, and stops at once the jobs we no longer hold.
            self.next_renew = now
        renew = now >= self.next_renew and self._leases_held()
        beat = now >= self.next_heartbeat
        if limit or renew or self.slotted or self.done or self.fails or self.handed_back:
            self._exchange(limit, renew, beat)
        elif beat:
            self._heartbeat()
        # After the exchange: it renewed our own leases first, had they run late.
        if self._reap_due(time.monotonic()):
            self._reap()

    def _tick_due(self) -> bool:
        if self.ticker is None or self.stopping or self.conn is None:
            return False
        if self.config.burst:
            return not self.burst_ticked
        return self.ticker.due()

    def _reap_due(self, now: float) -> bool:
        if self.config.reap_every is None or self.stopping or self.conn is None:
            return False
        if self._burst_idle():
            return not self.burst_reaped
        return now >= self.next_reap

    def _burst_idle(self) -> bool:
        """A --burst worker with nothing running, nothing to report and nothing due."""
        return (
            self.config.burst
            and not self.running
            and not self.prefetched
            and not (self.done or self.fails or self.handed_back)
            and self.last_claim_short
            and not self.claim_wanted
        )

    def _should_exit(self) -> bool:
        if self.running or self.prefetched:
            return False
        if self.done or self.fails or self.handed_back:
            return self._give_up_reporting()
        if self.stopping:
            return True
        if self.conn is None:
            return False
        if self.config.max_jobs is not None and self.claimed >= self.config.max_jobs:
            return True
        if self._burst_idle():
            # Not before its last reap: jobs a dead worker held may be due now.
            return self.burst_reaped or self.config.reap_every is None
        return False

    def _wait(self) -> None:
        """Watch the children until an event arrives or the nearest deadline;
        apply every event."""
        if self.events.empty():
            assert self._children is not None
            self._children.drive(self._next_deadline() - time.monotonic())
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            self._apply(event)

    def _next_deadline(self) -> float:
        now = time.monotonic()
        deadlines = [now + _IDLE_CAP]
        if self.stopping and not self.children_stopped:
            deadlines.append(self.grace_deadline)
        if self.report_deadline is not None:
            deadlines.append(self.report_deadline)
        if self.conn is None:
            deadlines.append(self.reconnect_at)
            return min(deadlines)
        if now < self.refused_until:
            deadlines.append(self.refused_until)
            return min(deadlines)
        if self.done or self.fails or self.handed_back or self.cancel_notices:
            deadlines.append(now)
        if self._leases_held():
            deadlines.append(self.next_renew)
        if self.slotted:
            deadlines.append(now)
        deadlines.append(self.next_heartbeat)
        if self.config.reap_every is not None and not self.stopping:
            deadlines.append(self.next_reap)
        if self.ticker is not None and not self.stopping and not self.config.burst:
            deadlines.append(self.ticker.deadline())
        if self._claim_limit() > 0:
            if self.claim_wanted:
                deadlines.append(now)
            deadlines.append(self.next_poll)
            if self.next_due is not None:
                deadlines.append(self.next_due)
        return min(deadlines)

    def _apply(self, event: object) -> None:
        if isinstance(event, _Finished):
            self._finished(event)
        elif event == _WAKE:
            self.claim_wanted = True
        elif event == _SCHEDULES:
            if self.ticker is not None:
                self.ticker.changed()
        elif isinstance(event, _CancelNotice):
            self.cancel_notices.update(held for held in event.held if self._holding(held))
        elif event in (_DEAF, _HEARING) and self.config.poll is None:
            # Until a notification can wake it, the loop looks for jobs often.
            self.poll = POLL_LISTENING if event == _HEARING else POLL_DEAF
            self.next_poll = min(self.next_poll, time.monotonic() + self.poll)
        elif isinstance(event, int):
            self._on_signal(event)

    def _claim_due(self, now: float) -> bool:
        return (
            self.claim_wanted
            or now >= self.next_poll
            or (self.next_due is not None and now >= self.next_due)
        )

    def _claim_limit(self) -> int:
        if self.stopping or self.conn is None:
            return 0
        # Free slots, and the room left in the local queue.
        free = self.config.concurrency + self.config.prefetch
        free -= len(self.running) + len(self.prefetched)
        if self.config.max_jobs is not None:
            free = min(free, self.config.max_jobs - self.claimed)
        return max(free, 0)

    # ------------------------------------------------------ database work

    def _exchange(self, limit: int, renew: bool, beat: bool = False) -> None:
        """Report, renew and claim in one statement (and heartbeat in the same
        round trip when `beat`); on failure keep everything for later."""
        conn = self.conn
        assert conn is not None
        c = self.config
        done, fails, handed_back = self.done, self.fails, self.handed_back
        held = self._leased() if renew else []
        # Prefetched jobs started since the last exchange (unless they have
        # ended meanwhile: a row is changed once per statement) take their
        # slot in locked_by, through the renewal.
        slotted = {k: n for k, n in self.slotted.items() if k in self.running}
        held += [k for k in slotted if k not in held]
        # The slots the jobs claimed now will take, in claim order, so that
        # locked_by names each job's slot (the lowest free ones first); the
        # jobs claimed beyond them wait in the local queue.
        slots = self._free_slots[::-1][:limit]
        sent = time.monotonic()
        if limit:
            # What asks for a claim from now on (a job ending, a notification)
            # asks for the next one.
            self.claim_wanted = False
            self.next_poll = sent + self.poll
        try:
            changed = claims.exchange(
                conn,
                done=[f.running.job.held for f in done],
                failed=[failure for _, failure in fails],
                handed_back=[f.running.job.held for f in handed_back],
                hand_back_reason=_HAND_BACK_REASON,
                renew=held,
                started={k[0]: n for k, n in slotted.items()},
                claim=limit,
                slots=slots,
                prefetch=limit - len(slots),
                lease=c.lease,
                worker=self.worker_id,
                queues=c.queues,
                kinds=c.kinds,
                floor=self.floors.floor(sent) if limit else None,
                beat=self._current_beat() if beat else None,
                max_payload_bytes=c.max_payload_bytes,
            )
        except (psycopg.Error, PgqctlError) as exc:
            self.claim_wanted = self.claim_wanted or bool(limit)
            # The server may have applied these reports with the answer lost.
            self.maybe_reported.update(f.running.job.held for f in done)
            self._connection_failed(exc)
            return
        if beat:
            self._beaten(changed.started_at, sent)
        self.floors.claimed(sent, changed.last_claimed)
        self.done, self.fails, self.handed_back = [], [], []
        self.slotted = {}
        # New jobs first: their slots wait on nothing else, the logs can.
        if limit:
            self._start_jobs(changed.claimed, slots, limit, sent)
        fenced_out = self._log_reports(done, fails, handed_back, changed)
        if fenced_out:
            self._explain_fenced_out(fenced_out)
        self.maybe_reported.clear()
        if changed.handed_back or any(r.status == "pending" for r in changed.failed.values()):
            # Back in the queue, maybe due already: the claim that went with
            # the report could not see them (one statement, one snapshot).
            self.claim_wanted = True
        if renew:
            self.next_renew = sent + c.lease / 3
        if held:
            self._check_renewal(held, changed.renewed)
        if limit:
            self._find_next_due()

    def _tick(self) -> None:
        """Enqueue the schedules' due ticks (at most once a second); log the jobs it added."""
        assert self.conn is not None and self.ticker is not None
        try:
            enqueued = self.ticker.check(self.conn)
        except (psycopg.Error, PgqctlError) as exc:
            self._connection_failed(exc)
            return
        self.burst_ticked = True
        skipped = [e for e in enqueued if e.skipped]
        if skipped:
            self._log_skipped(skipped)
        enqueued = [e for e in enqueued if e.jobs]
        if not enqueued:
            return
        # One line for the whole statement, however many schedules ticked.
        made = [
            (e.schedule, payload.iso_utc(t), i)
            for e in enqueued
            for t, i in zip(e.ticks, e.jobs, strict=True)
        ]
        parts = [f"{name} {tick} as job {i}" for name, tick, i in made]
        shown = ", ".join(parts[:20]) + (f" and {len(parts) - 20} more" if parts[20:] else "")
        self.log.event(
            "scheduled",
            f"enqueued {len(made)} schedule tick(s): {shown}",
            ticks=[{"schedule": n, "tick": t, "job_id": i} for n, t, i in made],
        )
        self.claim_wanted = True

    def _log_skipped(self, skipped: list[ticks.Enqueued]) -> None:
        """One line for the ticks skipped by the schedules' overlap policy."""
        parts = [
            f"{e.schedule} {', '.join(payload.iso_utc(t) for t in e.skipped[-3:])}"
            + (f" and {len(e.skipped) - 3} earlier" if e.skipped[3:] else "")
            for e in skipped
        ]
        self.log.event(
            "schedule_skipped",
            f"skipped {sum(len(e.skipped) for e in skipped)} schedule tick(s) (overlap "
            f"skip: one job of a schedule pending or running at a time): {'; '.join(parts)}",
            ticks=[
                {"schedule": e.schedule, "tick": payload.iso_utc(t)}
                for e in skipped
                for t in e.skipped
            ],
        )

    def _current_beat(self) -> claims.Beat:
        return replace(
            self.beat,
            started_at=self.started_at,
            running=sum(not r.lost for r in self.running.values()),
            done=self.jobs_done,
            failed=self.jobs_failed,
        )

    def _beaten(self, started_at: dt.datetime | None, sent: float) -> None:
        self.started_at = started_at
        self.next_heartbeat = sent + self.config.heartbeat

    def _heartbeat(self) -> None:
        """Heartbeat alone: nothing else was due (an idle or a fully busy worker)."""
        assert self.conn is not None
        sent = time.monotonic()
        try:
            started_at = claims.heartbeat(self.conn, self._current_beat())
        except (psycopg.Error, PgqctlError) as exc:
            self._connection_failed(exc)
            return
        self._beaten(started_at, sent)

    def _unregister(self) -> None:
        """A clean stop: remove this worker's row (if the database cannot be
        reached, the row goes stale and another worker removes it later)."""
        assert self.conn is not None
        if self._broken() or self.read_only:
            return
        try:
            claims.unregister(self.conn, self.worker_id)
        except (psycopg.Error, PgqctlError) as exc:
            if self.log.debug:
                self.log.error("could not remove this worker's row from workers", exc)

    def _reap(self) -> None:
        """Reclaim expired leases, as `pgqctl reap` does, and forget workers
        gone for an hour; log what it took."""
        assert self.conn is not None and self.config.reap_every is not None
        self.next_reap = time.monotonic() + jittered(self.config.reap_every)
        idle = self._burst_idle()
        try:
            reaped = admin.reap(self.conn, dead_after=self.config.dead_after)
            forgotten = claims.forget_stale(self.conn)
        except (psycopg.Error, PgqctlError) as exc:
            self._connection_failed(exc)  # a --burst worker reaps again once back
            return
        self.burst_reaped = idle
        if forgotten:
            self.log.event(
                "workers_forgotten",
                f"removed {len(forgotten)} worker(s) not seen for an hour from workers: "
                + ", ".join(forgotten),
                workers=forgotten,
            )
        if not reaped:
            return
        ids = [r.job.id for r in reaped]
        failed = [r.job.id for r in reaped if r.job.status == "failed"]
        holders = sorted({r.held_by or "an unnamed worker" for r in reaped})
        dead = sorted({(r.held_by or "").rpartition(":")[0] for r in reaped if r.reason == "dead"})
        shown = ", ".join(map(str, ids[:20])) + (f" and {len(ids) - 20} more" if ids[20:] else "")
        what = f"{len(ids)} expired lease(s)"
        if dead:
            of_dead = sum(r.reason == "dead" for r in reaped)
            what = f"{len(ids)} job(s) ({of_dead} of dead worker(s) {', '.join(dead)})"
        self.log.event(
            "reaped",
            f"reaped {what} (job {shown}) held by "
            f"{', '.join(holders)}: {len(ids) - len(failed)} back to pending, "
            f"{len(failed)} failed (out of attempts)",
            jobs=ids,
            failed=failed,
            held_by=holders,
            dead_workers=dead,
        )
        if len(failed) < len(ids):
            self.claim_wanted = True  # back in the queue and due now

    def _start_jobs(self, jobs: list[Job], slots: list[int], limit: int, now: float) -> None:
        """Start the jobs claimed for free slots; queue those claimed beyond them."""
        if jobs:
            self.burst_reaped = False  # reap again before deciding nothing is due
        if jobs and not self._leases_held():
            self.next_renew = now + self.config.lease / 3
        started = min(len(jobs), len(slots))
        del self._free_slots[len(self._free_slots) - started :]
        for job, slot in zip(jobs, slots, strict=False):
            running = _Running(job, runner.Stop(), slot)
            self.running[job.held] = running
            self._launch(running)
        self.prefetched.extend(
            _Running(job, runner.Stop(), prefetched=True) for job in jobs[started:]
        )
        self.claimed += len(jobs)
        self.last_claim_short = len(jobs) < limit
        self.next_due = None

    def _start_prefetched(self) -> None:
        """A slot is free: start the job prefetched first, if any."""
        if self.stopping or not self.prefetched or not self._free_slots:
            return
        running = self.prefetched.popleft()
        running.prefetched = False
        running.slot = self._free_slots.pop()
        self.running[running.job.held] = running
        self.slotted[running.job.held] = running.slot
        self._launch(running)

    def _leased(self) -> list[Held]:
        """The jobs whose leases this worker renews: running (unless lost) and prefetched."""
        held = [r.job.held for r in self.running.values() if r.holds_lease]
        return held + [r.job.held for r in self.prefetched]

    def _leases_held(self) -> bool:
        return bool(self.prefetched) or any(r.holds_lease for r in self.running.values())

    def _holding(self, key: Held) -> _Running | None:
        """The job this worker holds under `key`, running (unless lost) or prefetched."""
        running = self.running.get(key)
        if running is not None:
            return None if running.lost else running
        return next((r for r in self.prefetched if r.job.held == key), None)

    def _drop_prefetched(self, running: _Running) -> None:
        with contextlib.suppress(ValueError):
            self.prefetched.remove(running)

    def _hand_back_prefetched(self) -> None:
        """Stopping: hand the prefetched jobs back at once, without using an attempt."""
        while self.prefetched:
            self.handed_back.append(_Finished(self.prefetched.popleft(), runner.Outcome()))

    def _find_next_due(self) -> None:
        """After a short claim: when is the next delayed job due? (Sleep until then.)"""
        if self.last_claim_short and not self.config.burst and self.conn is not None:
            try:
                due = claims.next_due(self.conn, queues=self.config.queues, kinds=self.config.kinds)
            except (psycopg.Error, PgqctlError) as exc:
                self._connection_failed(exc)
                return
            if due is not None:
                self.next_due = time.monotonic() + max(due, 0.0)

    def _check_cancel_notices(self) -> None:
        """Stop the held jobs a notification said were cancelled, once their
        rows confirm it."""
        assert self.conn is not None
        held = [k for k in self.cancel_notices if self._holding(k)]
        self.cancel_notices.clear()
        if not held:
            return
        try:
            found = claims.ended(self.conn, held)
        except (psycopg.Error, PgqctlError) as exc:
            self.cancel_notices.update(held)  # asked again once reconnected
            self._connection_failed(exc)
            return
        for key in held:
            running = self._holding(key)
            status, why = found.get(key[0], ("", None))
            if running is not None and status == "cancelled":
                self._stop_cancelled(running, why, "notification")

    def _stop_cancelled(self, running: _Running, error: str | None, noticed: str) -> None:
        """An operator cancelled a job this worker runs: stop its process
        group (SIGTERM, then SIGKILL) and drop its result; the database
        already says cancelled. A prefetched one leaves the local queue unstarted."""
        job = running.job
        if running.prefetched:
            self._drop_prefetched(running)
            what = f" before it started (prefetched): attempt {job.tries} dropped"
        else:
            running.lost = True
            running.stop.request("cancelled")
            what = f": stopping attempt {job.tries}"
        self.log.event(
            "cancelled",
            f"job {job.id} cancelled ({error or 'by an operator'}){what}; it is not retried",
            job_id=job.id,
            kind=job.kind,
            attempt=job.tries,
            reason=error,
            noticed=noticed,
            **({"prefetched": True} if running.prefetched else {}),
        )

    def _check_renewal(self, held: list[Held], kept: set[int]) -> None:
        gone = [key for key in held if key[0] not in kept and self._holding(key)]
        if not gone:
            return
        # Lost, cancelled by an operator (also without a notification,
        # through a transaction pooler), or done by the job's own
        # transaction: the job's row tells which.
        assert self.conn is not None
        try:
            ended = claims.ended(self.conn, gone)
        except (psycopg.Error, PgqctlError):
            ended = {}  # said as a lost lease; either way the job is stopped
        for key in gone:
            running = self._holding(key)
            if running is None:
                continue
            status, why = ended.get(key[0], ("", None))
            if status == "cancelled":
                self._stop_cancelled(running, why, "renewal")
                continue
            if status == "done" and not running.prefetched:
                self._completed_by_job(running)
                continue
            if running.prefetched:
                self._drop_prefetched(running)
                self.log.event(
                    "lease_lost",
                    f"job {running.job.id} lease lost before it started (prefetched): "
                    f"attempt {running.job.tries} is no longer this worker's; dropped",
                    job_id=running.job.id,
                    attempt=running.job.tries,
                    reason="renewal",
                    prefetched=True,
                )
                continue
            running.lost = True
            running.stop.request("lease lost")
            job = running.job
            self.log.event(
                "lease_lost",
                f"job {job.id} lease lost: attempt {job.tries} is no longer this worker's "
                "(reaped or taken over); stopping it, its result will be dropped",
                job_id=job.id,
                attempt=job.tries,
                reason="renewal",
            )

    def _completed_by_job(self, running: _Running) -> None:
        """The job's program committed its own "done" and runs on: let it
        finish, with nothing left to renew or report."""
        running.completed = True
        job = running.job
        self.log.event(
            "completed_by_job",
            f"job {job.id} done by its own transaction (attempt {job.tries}); "
            "its program runs on until it exits",
            job_id=job.id,
            kind=job.kind,
            attempt=job.tries,
        )

    def _reconnect(self) -> bool:
        try:
            self.conn = self.connect()
        except (ReadOnlyServer, PrivilegeMissing) as exc:
            self._cannot_go_on(str(exc))
            return False
        except (psycopg.Error, PgqctlError):
            self._schedule_reconnect()
            return False
        down = time.monotonic() - (self.lost_since or time.monotonic())
        self.log.event(
            "db_restored",
            f"database connection restored after {seconds(down)}",
            downtime=round(down, 3),
        )
        self.lost_since = None
        self.reconnect_delay = RECONNECT_FIRST
        # Catch up: renew what we hold, report, and look for work at once;
        # heartbeat too (our row comes back if someone removed it meanwhile).
        self.next_renew = time.monotonic()
        self.next_heartbeat = self.next_renew
        self.claim_wanted = True
        return True

    def _connection_failed(self, exc: BaseException) -> None:
        meant = None
        if isinstance(exc, psycopg.Error) and self.conn is not None:
            meant = db.explain(exc, self.conn)
        if meant is not None:
            # A standby (a failover), or a missing GRANT: retrying cannot help.
            self._cannot_go_on(str(meant))
            return
        kind = timeout_kind(exc)
        if kind is not None and not self._broken():
            self._held_up(exc, kind)
            return
        if isinstance(exc, psycopg.errors.TransactionRollback) and not self._broken():
            # Serialization failure or deadlock: the statement was rolled
            # back as a whole, the connection is fine; do it again at once.
            self.log.event(
                "db_conflict",
                f"transaction rolled back by a conflict ({reason(exc)}); retrying",
                error=reason(exc),
            )
            assert self.conn is not None
            _rollback_quietly(self.conn)
            self.next_renew = time.monotonic()
            self.claim_wanted = True
            return
        if _insufficient_resources(exc) and not self._broken():
            self._server_refused(exc)
            return
        if isinstance(exc, (psycopg.OperationalError, PgqctlError)):
            what = "database connection lost" if self._broken() else "database unavailable"
            waiting = len(self._unreported())
            self.log.event(
                "db_lost",
                f"{what}: {reason(exc)}; retrying with backoff ({len(self.running)} job(s) "
                f"keep running; their results and {waiting} finished job(s) are reported "
                "once it is back)",
                error=reason(exc),
                running=len(self.running),
                unreported=waiting,
            )
        else:
            self.log.error("database error; retrying with backoff", exc)
        self._drop_connection()

    def _held_up(self, exc: BaseException, kind: str) -> None:
        """A statement gave up at its lock (or statement) timeout: the
        database is there, another session holds it up. Say which, and try
        again at once (each try waits that timeout again)."""
        assert self.conn is not None
        ours = [self.conn.info.backend_pid]
        _rollback_quietly(self.conn)
        limit = self.config.timeouts.limit(kind)
        blocker = self.find_blocker(waited=waited(kind, limit), ours=ours)
        if blocker is None:
            message = (
                f"gave up after the {kind} timeout ({spelled(limit)}): {reason(exc)}, "
                "and no session holds a lock on the queue's tables now; retrying"
            )
        else:
            message = (
                f"blocked by {blocker.describe()}, which holds a lock on {blocker.relation} "
                f"(waited {spelled(limit)}, the {kind} timeout); retrying: "
                f"{blocker.ending()} ends it"
            )
        self.log.event(
            "db_blocked",
            message,
            error=reason(exc),
            blocker=None if blocker is None else blocker.pid,
        )
        self.next_renew = time.monotonic()
        self.claim_wanted = True

    def _server_refused(self, exc: BaseException) -> None:
        """The server refused a statement for want of a resource (SQLSTATE
        class 53: disk full, out of memory...). The connection is fine and a
        new one would be refused the same: say what the server said and wait,
        longer each time while it goes on (a refusal after a quiet while
        starts short again)."""
        now = time.monotonic()
        if now - self.refused_until > 2 * RECONNECT_CAP:
            self.refused_delay = RECONNECT_FIRST
        delay = jittered(self.refused_delay)
        self.refused_delay = min(self.refused_delay * 2, RECONNECT_CAP)
        self.refused_until = now + delay
        waiting = len(self._unreported())
        sqlstate = getattr(exc, "sqlstate", None)
        self.log.event(
            "server_refused",
            f"the server refused: {reason(exc)} (SQLSTATE {sqlstate}); retrying in "
            f"{seconds(delay)} ({len(self.running)} job(s) keep running; their results and "
            f"{waiting} finished job(s) are reported once it accepts them)",
            error=reason(exc),
            sqlstate=sqlstate,
            retry_in=round(delay, 3),
            running=len(self.running),
            unreported=waiting,
        )
        assert self.conn is not None
        _rollback_quietly(self.conn)

    def _broken(self) -> bool:
        return self.conn is None or self.conn.broken or self.conn.closed

    def _cannot_go_on(self, message: str) -> None:
        """The server became a standby (a failover), or refuses this role:
        nothing can be reported or claimed there. Stop every job now and exit
        1; their leases expire and reap returns them."""
        self.log.event("db_refused", f"{message}; stopping", error=message)
        self.read_only = True
        self.exit_code = 1
        self.stopping = True
        self.stop_now = True
        self.prefetched.clear()  # nothing can be handed back there: reap returns them
        if self.conn is not None:
            _close_quietly(self.conn)
            self.conn = None

    def _drop_connection(self) -> None:
        if self.conn is not None:
            _close_quietly(self.conn)
            self.conn = None
        if self.lost_since is None:
            self.lost_since = time.monotonic()
        self._schedule_reconnect()

    def _schedule_reconnect(self) -> None:
        self.reconnect_at = time.monotonic() + jittered(self.reconnect_delay)
        self.reconnect_delay = min(self.reconnect_delay * 2, RECONNECT_CAP)

    def _give_up_reporting(self) -> bool:
        """While stopping with results the database cannot take: wait a little, then exit 1."""
        if self.read_only:
            return True  # a standby takes no results, however long we wait
        if not self.stopping or self.conn is not None:
            return False
        now = time.monotonic()
        if self.report_deadline is None:
            self.report_deadline = now + REPORT_WAIT
            return False
        if now < self.report_deadline:
            return False
        ids = sorted(f.running.job.id for f in self._unreported())
        shown = ", ".join(map(str, ids[:20])) + (f" and {len(ids) - 20} more" if ids[20:] else "")
        self.log.event(
            "unreported",
            f"could not report {len(ids)} job(s) ({shown}): the database is unreachable; "
            "they return to the queue when their leases expire (`pgqctl reap`)",
            jobs=ids,
        )
        self.exit_code = 1
        return True

    def _unreported(self) -> list[_Finished]:
        return [*self.done, *(f for f, _ in self.fails), *self.handed_back]

    # -------------------------------------------------- finished jobs

    def _finished(self, finished: _Finished) -> None:
        running = finished.running
        self.running.pop(running.job.held, None)
        if running.slot >= 0:
            self._free_slots.append(running.slot)
            running.slot = -1
            self._start_prefetched()
        self.claim_wanted = True
        if running.lost:
            return  # said when the lease was found lost
        if running.completed:
            self._log_done(finished, by_job=True)
            return
        if finished.committed:  # a SQL job: done with its statement's writes
            self._log_done(finished)
            return
        if finished.fenced_out:  # a SQL job whose attempt no longer ran: nothing committed
            running.lost = True
            self._explain_fenced_out([(finished, "done")])
            return
        job = running.job
        outcome = finished.outcome
        if finished.rejected is not None:
            failure = Failure(job.id, job.attempts, finished.rejected, 0.0, permanent=True)
            self.fails.append((finished, failure))
        elif outcome.never_starts:  # no such program, arguments too long: same every time
            failure = Failure(job.id, job.attempts, outcome.last_error(), 0.0, permanent=True)
            self.fails.append((finished, failure))
        elif outcome.succeeded:
            self.done.append(finished)
        elif outcome.stopped:  # only a shutdown stops a child whose lease we hold
            self.handed_back.append(finished)
        else:
            delay = backoff_delay(job.tries, self.config.backoff)
            self.fails.append(
                (finished, Failure(job.id, job.attempts, outcome.last_error(), delay))
            )

    def _log_reports(
        self,
        done: list[_Finished],
        fails: list[tuple[_Finished, Failure]],
        handed_back: list[_Finished],
        changed: claims.Exchanged,
    ) -> list[tuple[_Finished, str]]:
        """Log each applied report; return the fenced-out ones with what they tried."""
        fenced_out: list[tuple[_Finished, str]] = []
        for finished in done:
            if finished.running.job.id in changed.done:
                self._log_done(finished)
            else:
                fenced_out.append((finished, "done"))
        for finished, failure in fails:
            result = changed.failed.get(failure.job_id)
            if result is not None:
                self._log_failure(finished, failure, result)
            else:
                fenced_out.append((finished, "failed"))
        for finished in handed_back:
            job = finished.running.job
            if job.id in changed.handed_back:
                what = (
                    "not started (prefetched)"
                    if finished.running.prefetched
                    else "stopped by the shutdown"
                )
                self.log.event(
                    "handed_back",
                    f"job {job.id} handed back: attempt {job.tries} {what}; it runs again "
                    "without using up an attempt",
                    job_id=job.id,
                    attempt=job.tries,
                    prefetched=finished.running.prefetched,
                )
            else:
                fenced_out.append((finished, "handed back"))
        return fenced_out

    def _log_done(self, finished: _Finished, *, by_job: bool = False) -> None:
        """A job done: by this worker's report, or (`by_job`) by the job's own
        transaction, after which its program may still have failed or been
        stopped: the job stays done, and the log says how the program ended."""
        self.jobs_done += 1  # the next heartbeat says so
        job = finished.running.job
        outcome = finished.outcome
        duration = outcome.duration
        text = f"job {job.id} done in {seconds(duration)}"
        fields: dict[str, Any] = {}
        if by_job:
            text = f"job {job.id} done by its own transaction, in {seconds(duration)}"
            fields["completed_by"] = "job"
            if not outcome.succeeded:
                text += f"; then its program ended with {outcome.describe()} (it stays done)"
                fields.update(
                    error=outcome.describe(), exit_code=outcome.exit_code, signal=outcome.signal
                )
        self.log.event(
            "done",
            text,
            job_id=job.id,
            kind=job.kind,
            attempt=job.tries,
            duration=round(duration, 3),
            **fields,
        )

    def _log_failure(
        self, finished: _Finished, failure: Failure, result: claims.FailResult
    ) -> None:
        self.jobs_failed += 1
        job = finished.running.job
        outcome = finished.outcome
        what = finished.rejected or outcome.describe()
        fields: dict[str, Any] = {
            "job_id": job.id,
            "kind": job.kind,
            "attempt": job.tries,
            "max_attempts": job.max_attempts,
            "error": what,
            "exit_code": outcome.exit_code,
            "signal": outcome.signal,
            "timed_out": outcome.timed_out,
        }
        if result.status == "failed":
            why = (
                "it can never run"
                if failure.permanent
                else f"attempt {job.tries} of {job.max_attempts}"
            )
            self.log.event("failed", f"job {job.id} failed permanently ({why}): {what}", **fields)
            return
        self.log.event(
            "retry",
            f"job {job.id} failed: {what}; runs again in {seconds(failure.delay)} "
            f"(attempt {job.tries + 1} of {job.max_attempts})",
            retry_at=timestamp(result.run_at.timestamp()),
            delay=round(failure.delay, 3),
            **fields,
        )

    def _explain_fenced_out(self, fenced_out: list[tuple[_Finished, str]]) -> None:
        """Say why reports matched nothing: the job was taken over, reaped, or deleted."""
        assert self.conn is not None
        try:
            state = claims.fence_state(self.conn, [f.running.job.id for f, _ in fenced_out])
        except (psycopg.Error, PgqctlError):
            state = {}  # explained below as "no longer held"; the next step reconnects
        for finished, tried in fenced_out:
            job = finished.running.job
            status, attempts = state.get(job.id, ("", -1))
            if status == "done" and attempts == job.attempts:
                # Our own earlier report, whose answer the connection lost;
                # or else the job's program completed it in its own transaction.
                ours = tried == "done" and job.held in self.maybe_reported
                self._log_done(finished, by_job=not ours)
                continue
            if status == "cancelled" and attempts == job.attempts:
                # An operator cancelled it before the report came in.
                self.log.event(
                    "cancelled",
                    f"job {job.id} cancelled while attempt {job.tries} ran; "
                    f"its result ({tried}) dropped",
                    job_id=job.id,
                    kind=job.kind,
                    attempt=job.tries,
                    dropped=tried,
                    noticed="report",
                )
                continue
            if not state:
                why = "is no longer held by this worker"
            elif not status:
                why = "was deleted"
            elif attempts > job.attempts:
                why = f"was claimed again (now {status})"
            else:
                why = f"expired and was reaped (now {status})"
            self.log.event(
                "lease_lost",
                f"job {job.id} lease lost: attempt {job.tries} {why}; result ({tried}) dropped",
                job_id=job.id,
                attempt=job.tries,
                dropped=tried,
                status=status or None,
                attempts=attempts if status else None,
            )

    # --------------------------------------------------------- stopping

    def _on_signal(self, signum: int) -> None:
        self.signals += 1
        name = signal.Signals(signum).name
        count = len(self.running)
        # Jobs not started yet go back at once: another worker may run them
        # while ours finish.
        ahead = len(self.prefetched)
        self._hand_back_prefetched()
        back = f"; handing back {ahead} prefetched job(s)" if ahead else ""
        if self.signals == 1 and self.config.grace > 0 and count:
            self.stopping = True
            self.grace_deadline = time.monotonic() + self.config.grace
            self.log.event(
                "stopping",
                f"{name}: claiming no more jobs{back}; waiting up to "
                f"{seconds(self.config.grace)} for {count} running job(s) "
                "(signal again to stop them now)",
                signal=name,
                running=count,
                prefetched=ahead,
                grace=self.config.grace,
            )
            return
        self.stopping = True
        self.stop_now = True
        self.log.event(
            "stopping",
            (f"{name}: stopping {count} running job(s) now" if count else f"{name}: stopping")
            + back,
            signal=name,
            running=count,
            prefetched=ahead,
        )

    def _supervisor_failed(self, failure: BaseException) -> None:
        """The thread running children has failed: it reported every job it
        held as failed; report them, claim nothing more, and exit 1."""
        if self.exit_code == 0:
            self.log.error("the worker can no longer run jobs; stopping", failure)
            self.exit_code = 1
        self.stopping = True
        self.stop_now = True
        self.children_stopped = True
        self._hand_back_prefetched()

    def _stop_children(self) -> None:
        self.children_stopped = True
        for running in self.running.values():
            running.stop.request("the worker is stopping")

    # ---------------------------------------------------------- children

    def _launch(self, running: _Running) -> None:
        """Hand a claimed job's command to the supervisor; a payload that can
        never run, or a failure to prepare it, ends the job at once."""
        job = running.job
        c = self.config
        try:
            if isinstance(job.payload, Unreadable):  # what its row holds can never run
                raise payload.PayloadRejected(job.payload.reason)
            if self._sql is not None and job.kind in self._sql:
                self._sql.submit(
                    running,
                    job_id=job.id,
                    attempt=job.attempts,
                    kind=job.kind,
                    payload=json.dumps(job.payload),
                    timeout=c.timeout,
                    stop=running.stop,
                )
                return
            command = payload.command_for_job(
                job.payload,
                kind=job.kind,
                handlers=c.handler_map,
                allow_shell=c.allow_shell,
                default_timeout=c.timeout,
                policy=c.policy,
                environ=self.environ,
            )
            env = payload.job_environment(
                self.environ,
                job_id=job.id,
                kind=job.kind,
                queue=job.queue,
                attempt=job.tries,
                extra=command.env,
                claim=job.attempts,
                schema=c.schema,
                schedule=job.schedule,
                tick=job.tick,
            )
            assert self._children is not None
            self._children.submit(
                running,
                command,
                env,
                stop=running.stop,
                on_line=self._forwarder(job.id),
                cap=self.output_cap,
            )
        except payload.PayloadRejected as exc:
            self.events.put(_Finished(running, runner.Outcome(start_error=exc.reason), exc.reason))
        except Exception as exc:  # never lose the job's report
            self._child_done(running, runner.Outcome(), exc)

    def _child_started(self, key: object, pid: int) -> None:
        """A job's process exists (called on whichever thread started it)."""
        self._log_started(key, f"pid {pid}", pid=pid)

    def _sql_started(self, key: object, backend_pid: int) -> None:
        """A SQL job's statement is about to run (called on its thread)."""
        self._log_started(key, f"SQL on backend pid {backend_pid}", backend_pid=backend_pid)

    def _log_started(self, key: object, where: str, **fields: Any) -> None:
        assert isinstance(key, _Running)
        job = key.job
        self.log.event(
            "started",
            f"job {job.id} started: {job.kind}, attempt {job.tries} of {job.max_attempts} "
            f"(queue {job.queue}, slot {key.slot}, {where})",
            job_id=job.id,
            kind=job.kind,
            queue=job.queue,
            attempt=job.tries,
            max_attempts=job.max_attempts,
            slot=key.slot,
            **fields,
        )

    def _sql_done(self, key: object, result: sql_jobs.SqlResult) -> None:
        """A SQL job ended (called on its thread): post its result, waking the loop."""
        assert isinstance(key, _Running)
        self._post(
            _Finished(key, result.outcome, committed=result.committed, fenced_out=result.fenced_out)
        )

    def _child_done(
        self, key: object, outcome: runner.Outcome, error: BaseException | None
    ) -> None:
        """A child ended (called on whichever thread watches the children): post its result."""
        assert isinstance(key, _Running)
        if error is not None:
            self.log.error(f"job {key.job.id}: unexpected error running it", error)
            outcome = runner.Outcome(start_error=f"worker error: {error}")
        elif outcome.left_out_bytes or outcome.left_out_lines:
            self._log_left_out(key.job.id, outcome)
        self.events.put(_Finished(key, outcome))

    def _log_left_out(self, job_id: int, outcome: runner.Outcome) -> None:
        c = self.config
        self.log.event(
            "output_left_out",
            f"job {job_id} output: {outcome.left_out_bytes:,} bytes in "
            f"{outcome.left_out_lines:,} line(s) left out of this log, which takes the first "
            f"{c.log_output_lines:,} lines and {c.log_output_bytes:,} bytes of a job's output "
            "(--log-output-lines, --log-output-bytes)",
            job_id=job_id,
            left_out_bytes=outcome.left_out_bytes,
            left_out_lines=outcome.left_out_lines,
            output_bytes=outcome.output_bytes,
        )

    def _forwarder(self, job_id: int) -> Callable[[str], None]:
        event = self.log.event

        def forward(line: str) -> None:
            event("output", f"job {job_id} | {line}", job_id=job_id, line=line)

        return forward

    # ---------------------------------------------------------- listener

    def _listen(self) -> None:
        """Post a wake-up for each notification about our schema; reconnect on failure.

        Through a transaction pooler a LISTEN stays on whichever server
        connection ran it, so the listener first makes sure it can hear (see
        `_can_hear`); if it cannot, it says so once and ends, and the loop
        polls every POLL_DEAF seconds instead.
        """
        delay = RECONNECT_FIRST
        while not self._closing.is_set():
            conn = None
            try:
                conn = self.listen_connect()
                if not self._can_hear(conn):
                    self._post(_DEAF)
                    self._say_deaf()
                    return
                # Cancels first: hearing about new jobs is then the sign
                # that both are heard (`pg_stat_activity` shows the last).
                conn.execute(query("worker_listen_schedules"))
                conn.execute(query("worker_listen_cancel"))
                conn.execute(query("worker_listen"))
                delay = RECONNECT_FIRST
                self._post(_HEARING)
                # Jobs may have come while nobody listened.
                self._post(_WAKE)
                self._relay_notifications(conn)
            except Exception as exc:
                if self.log.debug:
                    self.log.error("listen connection failed; polling until it is back", exc)
            finally:
                if conn is not None:
                    _close_quietly(conn)
            self._post(_DEAF)
            if self._closing.wait(jittered(delay)):
                return
            delay = min(delay * 2, RECONNECT_CAP)

    def _can_hear(self, conn: db.QueueConnection) -> bool:
        """Whether a LISTEN on `conn` hears notifications: on a direct
        connection, and behind a pooler that keeps a server connection for
        each client (session pooling); not behind one that hands it to other
        clients after each transaction, where the LISTEN would stay behind."""
        if not conn.pooled:
            return True
        with self.listen_connect() as other:
            return not db.shares_server_connections(conn, other)

    def _say_deaf(self) -> None:
        every = self.config.poll if self.config.poll is not None else POLL_DEAF
        self.log.event(
            "listen_unavailable",
            f"notifications cannot be heard through {self.listen_target} (a transaction "
            f"pooler): looking for jobs every {seconds(every)} instead; give --listen-dsn "
            "a direct or session-pooled connection to wake on new jobs at once",
            target=self.listen_target,
            poll=every,
        )

    def _relay_notifications(self, conn: psycopg.Connection[Any]) -> None:
        # poll() on the socket and on the closing pipe, so stopping the
        # worker never waits for a notifies() timeout. (Not select(): with
        # hundreds of jobs running, the socket's fd may be above 1023.)
        poller = select.poll()
        for fd in (conn.fileno(), self._closing_r):
            poller.register(fd, select.POLLIN)
        while not self._closing.is_set():
            ready = [fd for fd, _ in poller.poll()]
            if self._closing_r in ready:
                return
            for note in conn.notifies(timeout=0):
                self._on_notification(note.channel, note.payload)

    def _on_notification(self, channel: str, payload: str) -> None:
        """Hand a notification to its channel's handler (on the listener's thread)."""
        handler = self._channel_handlers.get(channel)
        if handler is not None:
            handler(payload)

    def _on_jobs_notified(self, payload: str) -> None:
        # New jobs, requeued or reaped ones, a resumed queue: look for work,
        # unless it is about another schema of the same database.
        if payload in ("", self.config.schema):
            self._post(_WAKE)

    def _on_schedules_notified(self, payload: str) -> None:
        # A schedule was added, changed or removed: read them again.
        if payload in ("", self.config.schema):
            self._post(_SCHEDULES)

    def _on_cancel_notified(self, payload: str) -> None:
        notice = self._cancel_notice(payload)
        if notice is not None:
            self._post(notice)

    def _cancel_notice(self, text: str) -> _CancelNotice | None:
        """The jobs a cancel notification names, if it is about our schema."""
        try:
            found = json.loads(text)
            if found["schema"] != self.config.schema:
                return None
            return _CancelNotice(frozenset((int(i), int(a)) for i, a in found["jobs"]))
        except (ValueError, KeyError, TypeError):
            return None  # not one of ours


def _rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    # Out of the failed transaction, if the failure left one open.
    with contextlib.suppress(Exception):
        conn.rollback()


def _close_quietly(conn: psycopg.Connection[Any]) -> None:
    # A broken connection may fail to close; it is gone either way.
    with contextlib.suppress(Exception):
        conn.close()
