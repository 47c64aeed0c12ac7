"""The worker's loop: claim jobs, run each as a child process, report how it ended.

The loop owns the main connection, and the parts it holds never call back
into it (they take the few functions they need):

- `slots.Slots`: the jobs running and prefetched, the free slots, what to renew;
- `outbox.Outbox`: finished jobs waiting to be reported, settled by the exchange's answer;
- `executor.Executor`: what runs a claimed job (a child process, or a --sql
  statement), which posts each job's end as an event;
- `ended.EndedElsewhere`: jobs that ended without the worker (cancelled,
  completed by their own transaction, lease lost), found and stopped;
- `listener.Listener`: its thread and connection; it only posts events;
- `upkeep.Upkeep`: reap, stale registry rows, schedule ticks, heartbeats: when each is due;
- `linger.Linger`: whether a finished job's report waits a moment for the
  jobs about to end beside it;
- `retry.Retry` and `shutdown.Shutdown`: when to try the database again, and how to stop;
- `narration.Narration`: one method per event of the log.

Threads, and who owns what:

- The main thread runs the loop (`Worker.run`). It alone uses the main
  connection: it claims jobs for the free slots, reports finished jobs,
  renews leases, and handles signals and reconnects. Everything that ended
  since the last time, the lease renewal when due and the next claim go out
  as one statement (`claims.exchange`): one round trip, one commit. The
  records of the attempts that ended (`attempts.record_attempts`) go in the
  same pipeline and transaction, just before it.
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
  handler of its channel (`Listener._on_notification`), which posts an event: for
  ``pgqctl_jobs``, a wake-up when it is about this schema; for
  ``pgqctl_cancel``, the jobs an operator cancelled (`pgqctl cancel`).
- Every --reap-every the loop also reclaims expired leases (`leases.reap`,
  the statement `pgqctl reap` runs), so a fleet without cron still gets a
  dead worker's jobs back; its own leases are live (renewed first). It
  then removes the rows of workers gone for an hour from `workers`.
- The worker registers itself in `workers` with its first exchange, and
  heartbeats there at least every --heartbeat: in the pipeline of an
  exchange when one goes out (no round trip of its own), alone otherwise
  (`registry.Beat`). A clean stop removes its row.
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
`slots.running`), then finished and waiting to be reported (in the outbox),
then reported. With --prefetch N, up to N more are claimed ahead of a free
slot and wait in `slots.prefetched` (a local FIFO, in claim order; locked_by
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

import contextlib
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

import psycopg

from pgqctl import __version__, claims, db, payload, registry
from pgqctl.blockers import Blocker, timeout_kind, waited
from pgqctl.errors import PgqctlError, PrivilegeMissing, ReadOnlyServer
from pgqctl.jobs import Job
from pgqctl.worker.config import POLL_DEAF, POLL_LISTENING, WorkerConfig, identity
from pgqctl.worker.ended import EndedElsewhere
from pgqctl.worker.executor import Executor
from pgqctl.worker.linger import Linger
from pgqctl.worker.listener import (
    DEAF,
    HEARING,
    LIMITS,
    SCHEDULES,
    WAKE,
    CancelNotice,
    Listener,
)
from pgqctl.worker.narration import Narration
from pgqctl.worker.outbox import HAND_BACK_REASON, Fenced, Finished, Outbox, Settled
from pgqctl.worker.retry import Retry
from pgqctl.worker.shutdown import Shutdown
from pgqctl.worker.slots import Running, Slots
from pgqctl.worker.upkeep import Upkeep
from pgqctl.worklog import WorkLog

# The loop wakes at least this often even with nothing to do.
_IDLE_CAP = 60.0
# A --burst worker waits for a job due within this many seconds (a retry with
# a short backoff, due a moment after the claim that found nothing) rather
# than exit and leave it pending.
BURST_WAITS_FOR = 1.0


def _insufficient_resources(exc: BaseException) -> bool:
    """SQLSTATE class 53 (disk_full, out_of_memory, too_many_connections...):
    the server answered, and said no for want of a resource. psycopg's
    classes for them do not all derive from InsufficientResources."""
    return isinstance(exc, psycopg.Error) and (exc.sqlstate or "").startswith("53")


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
        self.worker_id = identity()
        self.say = Narration(log, config, self.worker_id)
        self.target = describe_target
        self.listen_target = describe_listen_target or describe_target or "the database"
        self.events: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.exit_code = 0

        now = time.monotonic()
        self.conn: db.QueueConnection | None = None
        self.read_only = False  # the server refuses our writes for good (a standby)
        self.retry = Retry(now)
        self.stop = Shutdown()
        self.slots = Slots(config.concurrency, config.prefetch)
        self.outbox = Outbox(config.backoff, self.worker_id if config.history else None)
        self.ended = EndedElsewhere(self.slots, self.say)
        self.linger = Linger()
        self.executor = Executor(
            config,
            connect,
            # Taken and cleaned once: reading os.environ decodes every variable again.
            payload.without_credentials(os.environ if environ is None else environ),
            self.say,
            put=self.events.put,
            post=self._post,
        )
        self.listener = Listener(
            listen_connect or connect,
            config.schema,
            self._post,
            say_deaf=self._say_deaf,
            on_error=self._listen_failed,
        )
        beat = registry.Beat(
            id=self.worker_id,
            host=self.worker_id.rpartition(":")[0],
            pid=os.getpid(),
            version=__version__,
            queues=tuple(dict.fromkeys(config.queues)),
            kinds=tuple(dict.fromkeys(config.kinds)),
            concurrency=config.concurrency,
            heartbeat=config.heartbeat,
            lease=config.lease,
            dead_after=None if config.reap_every is None else config.dead_after,
        )
        self.upkeep = Upkeep(config, beat, now)

        # Claiming: how often to look without a notification (often, until
        # the listener hears them), and when.
        self.poll = POLL_DEAF if config.poll is None else config.poll
        self.claimed = 0
        self.floors = claims.Floors(enabled=not config.queues and not config.kinds)
        self.claim_wanted = True
        self.last_claim_short = False
        self.next_poll = now
        self.next_due: float | None = None
        self.next_renew = now

    # ------------------------------------------------------------- lifecycle

    def check(self, conn: db.QueueConnection) -> None:
        """Refuse to start (BadInput) with what no job could ever run: a
        --sql statement the server cannot prepare, or of the wrong parameters."""
        self.executor.check(conn)

    def run(self, conn: db.QueueConnection) -> int:
        """Work until told to stop (or, with burst/max-jobs, until done); the exit code."""
        self.conn = conn
        self.say.worker_started(self.target)
        previous = self._install_signal_handlers()
        self.executor.start()
        self.listener.start()
        try:
            while True:
                try:
                    self._act()
                    if self._should_exit():
                        break
                    self._wait()
                except Exception as exc:  # the loop must survive anything
                    self.say.error("unexpected error in the worker loop", exc)
                    self._drop_connection()
        finally:
            # Signals stay ours until the end: one arriving while the threads
            # stop must not kill a worker that is stopping cleanly.
            self.executor.close()
            self.listener.close()
            if self.conn is not None:
                self._unregister()
                self.conn.close()
            self._restore_signal_handlers(previous)
        self.say.worker_stopped(self.claimed, self.exit_code)
        return self.exit_code

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
        self.executor.wake()

    # ------------------------------------------------------------- the loop

    def _act(self) -> None:
        """Do whatever is due now: stop children, reconnect, report, renew, claim."""
        now = time.monotonic()
        self._watch_children(now)
        if not self._connected(now):
            return
        if self.ended.notices:
            self._check_cancel_notices()
            if self.conn is None:
                return
        if not self.stop.stopping and self.upkeep.tick_due():
            self._tick()
            if self.conn is None:
                return
        # The hot path: finished jobs out, leases renewed, new jobs claimed,
        # all in one exchange; the new jobs start as its answer comes. A
        # report (and the claim for its slot) may wait a moment for the jobs
        # about to end beside it (`linger`).
        renew = self._renew_due(now)
        beat = self.upkeep.beat_due(now)
        # An exchange that goes anyway (a renewal, a prefetched job's move to
        # its slot, a heartbeat) takes the report and the claim along.
        wait = self._report_wait(now, going=renew or beat or bool(self.slots.slotted))
        limit = self._claim_limit() if wait is None and self._claim_due(now) else 0
        if limit or renew or self.slots.slotted or (self.outbox and wait is None):
            self._exchange(limit, renew, beat)
        elif beat:
            self._heartbeat()
        # After the exchange: it renewed our own leases first, had they run late.
        if self._reap_due(time.monotonic()):
            self._reap()
        if (
            self.conn is not None
            and not self.stop.stopping
            and self.upkeep.archive_due(time.monotonic())
        ):
            self._archive()

    def _watch_children(self, now: float) -> None:
        """Act on what the executor says, and stop the jobs when it is time."""
        failure = self.executor.failure()
        if failure is not None:
            self._supervisor_failed(failure)
        self.executor.say_guard_lost()
        if self.stop.children_due(now):
            self._stop_children()

    def _connected(self, now: float) -> bool:
        """Whether the database can take an exchange now (reconnecting if due)."""
        if self.conn is None and (
            self.read_only or not self.retry.may_reconnect(now) or not self._reconnect()
        ):
            return False
        return not self.retry.refusing(now)

    def _renew_due(self, now: float) -> bool:
        if self.upkeep.silent_too_long(now):
            # A reap may have taken our jobs as a dead worker's. Renewing now
            # tells, and stops at once the jobs we no longer hold.
            self.next_renew = now
        return now >= self.next_renew and self.slots.leases_held()

    def _reap_due(self, now: float) -> bool:
        if self.stop.stopping or self.conn is None:
            return False
        return self.upkeep.reap_due(now, self._burst_idle())

    def _burst_idle(self) -> bool:
        """A --burst worker with nothing running, nothing to report and nothing due."""
        return (
            self.config.burst
            and not self.slots.busy()
            and not (self.outbox)
            and self.last_claim_short
            and not self.claim_wanted
            and self.next_due is None
        )

    def _should_exit(self) -> bool:
        if self.slots.busy():
            return False
        if self.outbox:
            return self._give_up_reporting()
        if self.stop.stopping:
            return True
        if self.conn is None:
            return False
        if self.config.max_jobs is not None and self.claimed >= self.config.max_jobs:
            return True
        if self._burst_idle():
            # Not before its last reap: jobs a dead worker held may be due now.
            return self.upkeep.reaped_last()
        return False

    def _wait(self) -> None:
        """Watch the children until an event arrives or the nearest deadline;
        apply every event."""
        if self.events.empty():
            self.executor.drive(self._next_deadline() - time.monotonic())
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            self._apply(event)

    def _next_deadline(self) -> float:
        now = time.monotonic()
        deadlines = [now + _IDLE_CAP, *self.stop.deadlines()]
        if self.conn is None:
            deadlines.append(self.retry.reconnect_at)
            return min(deadlines)
        if self.retry.refusing(now):
            deadlines.append(self.retry.refused_until)
            return min(deadlines)
        # When the report goes, and with it the claim it holds back.
        report_at = self._report_wait(now) or now
        if self.outbox:
            deadlines.append(report_at)
        if self.ended.notices:
            deadlines.append(now)
        if self.slots.leases_held():
            deadlines.append(self.next_renew)
        if self.slots.slotted:
            deadlines.append(now)
        deadlines += self.upkeep.deadlines(self.stop.stopping)
        if self._claim_limit() > 0:
            claim_at = [self.next_poll]
            if self.claim_wanted:
                claim_at.append(now)
            if self.next_due is not None:
                claim_at.append(self.next_due)
            # Not before the report it waits for: a claim due meanwhile
            # would wake the loop for nothing until then.
            deadlines += [max(at, report_at) for at in claim_at]
        return min(deadlines)

    def _apply(self, event: object) -> None:
        if isinstance(event, Finished):
            self._finished(event)
        elif event == WAKE:
            self.claim_wanted = True
        elif event == SCHEDULES:
            self.upkeep.schedules_changed()
        elif event == LIMITS:
            # Claim as limits require at once; the next heartbeat, due now,
            # says whether any is left.
            self.upkeep.limited = True
            self.upkeep.beat_at(time.monotonic())
            self.claim_wanted = True
        elif isinstance(event, CancelNotice):
            self.ended.noticed(event.held)
        elif event in (DEAF, HEARING) and self.config.poll is None:
            # Until a notification can wake it, the loop looks for jobs often.
            self.poll = POLL_LISTENING if event == HEARING else POLL_DEAF
            self.next_poll = min(self.next_poll, time.monotonic() + self.poll)
        elif isinstance(event, int):
            self._on_signal(event)

    def _report_wait(self, now: float, *, going: bool = False) -> float | None:
        """Until when the finished jobs' report waits for others about to
        end (None: it goes now; so it does with an exchange `going` anyway)."""
        if going or not self.outbox or self.stop.stopping:
            return None
        return self.linger.until(now, self.slots.running.values())

    def _claim_due(self, now: float) -> bool:
        return (
            self.claim_wanted
            or now >= self.next_poll
            or (self.next_due is not None and now >= self.next_due)
        )

    def _claim_limit(self) -> int:
        if self.stop.stopping or self.conn is None:
            return 0
        free = self.slots.room()
        if self.config.max_jobs is not None:
            free = min(free, self.config.max_jobs - self.claimed)
        return max(min(free, claims.MOST_PER_CLAIM), 0)

    # ------------------------------------------------------ database work

    def _exchange(self, limit: int, renew: bool, beat: bool = False) -> None:
        """Report, renew and claim in one statement (and heartbeat in the same
        round trip when `beat`); on failure keep everything for later."""
        conn = self.conn
        assert conn is not None
        c = self.config
        report = self.outbox.report()
        held = self.slots.leased() if renew else []
        # Prefetched jobs started since the last exchange take their slot in
        # locked_by, through the renewal.
        slotted = self.slots.to_move()
        held += [k for k in slotted if k not in held]
        # The slots the jobs claimed now will take, so that locked_by names
        # each job's slot; the jobs claimed beyond them wait in the local queue.
        slots = self.slots.free_for(limit)
        sent = time.monotonic()
        if limit:
            # What asks for a claim from now on (a job ending, a notification)
            # asks for the next one.
            self.claim_wanted = False
            self.next_poll = sent + self.poll
        try:
            changed = claims.exchange(
                conn,
                done=[f.running.job.held for f in report.done],
                failed=[failure for _, failure in report.fails],
                handed_back=[f.running.job.held for f in report.handed_back],
                hand_back_reason=HAND_BACK_REASON,
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
                limited=self.upkeep.limited,
                beat=self.upkeep.current_beat(self.slots.live()) if beat else None,
                max_payload_bytes=c.max_payload_bytes,
                records=report.records,
                now=sent,
            )
        except (psycopg.Error, PgqctlError) as exc:
            self.claim_wanted = self.claim_wanted or bool(limit)
            self.outbox.unsent(report)
            self._connection_failed(exc)
            return
        if changed.beaten is not None:
            self.upkeep.beaten(changed.beaten, sent)
        self.floors.claimed(sent, changed.last_claimed)
        if changed.wake is not None:
            # A rate limit held jobs back: claim again when it has a token.
            self.next_poll = min(self.next_poll, sent + changed.wake)
        self.linger.exchanged(time.monotonic() - sent)
        settled = self.outbox.settle(report, changed)
        self.slots.moved()
        # New jobs first: their slots wait on nothing else, the logs can.
        if limit:
            self._start_jobs(changed.claimed, slots, limit, sent)
        self._log_reports(settled)
        if settled.fenced_out:
            self._explain_fenced_out(settled.fenced_out)
        if settled.requeued:
            self.claim_wanted = True
        if renew:
            self.next_renew = sent + c.lease / 3
        if held:
            self.ended.check_renewal(conn, held, changed.renewed)
        if limit:
            self._find_next_due()

    def _tick(self) -> None:
        """Enqueue the schedules' due ticks (at most once a second); log the jobs it added."""
        assert self.conn is not None
        try:
            enqueued = self.upkeep.tick(self.conn)
        except (psycopg.Error, PgqctlError) as exc:
            self._connection_failed(exc)
            return
        skipped = [e for e in enqueued if e.skipped]
        if skipped:
            self.say.schedule_skipped(skipped)
        enqueued = [e for e in enqueued if e.jobs]
        if not enqueued:
            return
        self.say.scheduled(enqueued)
        self.claim_wanted = True

    def _heartbeat(self) -> None:
        """Heartbeat alone: nothing else was due (an idle or a fully busy worker)."""
        assert self.conn is not None
        try:
            self.upkeep.heartbeat(self.conn, self.slots.live(), time.monotonic())
        except (psycopg.Error, PgqctlError) as exc:
            self._connection_failed(exc)

    def _unregister(self) -> None:
        """A clean stop: remove this worker's row (if the database cannot be
        reached, the row goes stale and another worker removes it later)."""
        assert self.conn is not None
        if self._broken() or self.read_only:
            return
        try:
            registry.unregister(self.conn, self.worker_id)
        except (psycopg.Error, PgqctlError) as exc:
            self.say.debug_error("could not remove this worker's row from workers", exc)

    def _reap(self) -> None:
        """Reclaim expired leases, as `pgqctl reap` does, and forget workers
        gone for an hour; log what it took."""
        assert self.conn is not None
        try:
            reaped, forgotten = self.upkeep.reap(self.conn, time.monotonic(), self._burst_idle())
        except (psycopg.Error, PgqctlError) as exc:
            self._connection_failed(exc)  # a --burst worker reaps again once back
            return
        if forgotten:
            self.say.workers_forgotten(forgotten)
        if not reaped:
            return
        self.say.reaped(reaped)
        if any(r.job.status != "failed" for r in reaped):
            self.claim_wanted = True  # back in the queue and due now

    def _archive(self) -> None:
        """Move jobs finished --archive-after ago into the history; log how many."""
        assert self.conn is not None
        try:
            moved = self.upkeep.archive(self.conn, time.monotonic())
        except psycopg.errors.InsufficientPrivilege as exc:
            # A role without rights on the history (a GRANT made before it
            # existed): the jobs stay in jobs, where every command reads them.
            _rollback_quietly(self.conn)
            self.upkeep.archive_off()
            self.say.archive_refused(exc)
            return
        except psycopg.errors.CheckViolation as exc:
            # A day a purge dropped as jobs of it moved: the next move makes
            # it again and moves them; the connection is fine.
            _rollback_quietly(self.conn)
            self.say.error("could not move finished jobs into the history; trying again", exc)
            return
        except (psycopg.Error, PgqctlError) as exc:
            self._connection_failed(exc)
            return
        if moved.jobs:
            self.say.archived(moved.jobs)

    def _find_next_due(self) -> None:
        """After a short claim: when is the next delayed job due? (Sleep until
        then.) A --burst worker waits only for one due within BURST_WAITS_FOR."""
        if self.last_claim_short and self.conn is not None:
            try:
                due = claims.next_due(self.conn, queues=self.config.queues, kinds=self.config.kinds)
            except (psycopg.Error, PgqctlError) as exc:
                self._connection_failed(exc)
                return
            if due is not None and (not self.config.burst or due <= BURST_WAITS_FOR):
                self.next_due = time.monotonic() + max(due, 0.0)

    def _check_cancel_notices(self) -> None:
        assert self.conn is not None
        try:
            self.ended.check_notices(self.conn)
        except (psycopg.Error, PgqctlError) as exc:
            self._connection_failed(exc)

    def _explain_fenced_out(self, fenced_out: list[Fenced]) -> None:
        """Reports that matched nothing: count those done after all, say the others."""
        assert self.conn is not None
        for finished, by_job in self.ended.explain_fenced_out(self.conn, fenced_out):
            self._done(finished, by_job=by_job)

    # ------------------------------------------- when the database fails us

    def _reconnect(self) -> bool:
        try:
            self.conn = self.connect()
        except (ReadOnlyServer, PrivilegeMissing) as exc:
            self._cannot_go_on(str(exc))
            return False
        except (psycopg.Error, PgqctlError):
            self.retry.reconnect_failed(time.monotonic())
            return False
        self.say.db_restored(self.retry.restored(time.monotonic()))
        # Catch up: renew what we hold, report, and look for work at once;
        # heartbeat too (our row comes back if someone removed it meanwhile).
        self.next_renew = time.monotonic()
        self.upkeep.beat_at(self.next_renew)
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
            self.say.db_conflict(exc)
            assert self.conn is not None
            _rollback_quietly(self.conn)
            self._catch_up()
            return
        if _insufficient_resources(exc) and not self._broken():
            self._server_refused(exc)
            return
        if isinstance(exc, (psycopg.OperationalError, PgqctlError)):
            what = "database connection lost" if self._broken() else "database unavailable"
            self.say.db_lost(
                what,
                exc,
                running=len(self.slots.running),
                unreported=len(self.outbox.report().finished()),
            )
        else:
            self.say.error("database error; retrying with backoff", exc)
        self._drop_connection()

    def _catch_up(self) -> None:
        """Renew and claim at once: the last try was rolled back."""
        self.next_renew = time.monotonic()
        self.claim_wanted = True

    def _held_up(self, exc: BaseException, kind: str) -> None:
        """A statement gave up at its lock (or statement) timeout: the
        database is there, another session holds it up. Say which, and try
        again at once (each try waits that timeout again)."""
        assert self.conn is not None
        ours = [self.conn.info.backend_pid]
        _rollback_quietly(self.conn)
        limit = self.config.timeouts.limit(kind)
        blocker = self.find_blocker(waited=waited(kind, limit), ours=ours)
        self.say.db_blocked(exc, kind, limit, blocker)
        self._catch_up()

    def _server_refused(self, exc: BaseException) -> None:
        """The server refused a statement for want of a resource (SQLSTATE
        class 53: disk full, out of memory...). The connection is fine and a
        new one would be refused the same: say what the server said and wait."""
        delay = self.retry.refused(time.monotonic())
        self.say.server_refused(
            exc,
            delay,
            running=len(self.slots.running),
            unreported=len(self.outbox.report().finished()),
        )
        assert self.conn is not None
        _rollback_quietly(self.conn)

    def _broken(self) -> bool:
        return self.conn is None or self.conn.broken or self.conn.closed

    def _cannot_go_on(self, message: str) -> None:
        """The server became a standby (a failover), or refuses this role:
        nothing can be reported or claimed there. Stop every job now and exit
        1; their leases expire and reap returns them."""
        self.say.db_refused(message)
        self.read_only = True
        self.exit_code = 1
        self.stop.at_once()
        self.slots.take_prefetched()  # nothing can be handed back there: reap returns them
        if self.conn is not None:
            _close_quietly(self.conn)
            self.conn = None

    def _drop_connection(self) -> None:
        if self.conn is not None:
            _close_quietly(self.conn)
            self.conn = None
        self.retry.lost(time.monotonic())

    def _give_up_reporting(self) -> bool:
        """While stopping with results the database cannot take: wait a little, then exit 1."""
        if self.read_only:
            return True  # a standby takes no results, however long we wait
        if not self.stop.give_up_reporting(time.monotonic(), connected=self.conn is not None):
            return False
        self.say.unreported(sorted(f.running.job.id for f in self.outbox.report().finished()))
        self.exit_code = 1
        return True

    # -------------------------------------------------- jobs in and out

    def _start_jobs(self, jobs: list[Job], slots: list[int], limit: int, now: float) -> None:
        """Start the jobs claimed for free slots; queue those claimed beyond them."""
        if jobs:
            self.upkeep.jobs_claimed()
        if jobs and not self.slots.leases_held():
            self.next_renew = now + self.config.lease / 3
        for running in self.slots.claimed(jobs, slots, now):
            self._launch(running)
        self.claimed += len(jobs)
        self.last_claim_short = len(jobs) < limit
        if not self.last_claim_short and self._claim_limit():
            # A whole claim of MOST_PER_CLAIM, and slots still free: at once.
            self.claim_wanted = True
        self.next_due = None

    def _launch(self, running: Running) -> None:
        running.began = time.monotonic()
        self.executor.launch(running)

    def _finished(self, finished: Finished) -> None:
        running = finished.running
        if self.slots.release(running) and not self.stop.stopping:
            # A slot is free: start the job prefetched first, if any.
            next_one = self.slots.start_prefetched()
            if next_one is not None:
                self._launch(next_one)
        self.claim_wanted = True
        what = self.outbox.add(finished)
        self.linger.ended(running, finished.at)
        if what == "by_job":
            self._done(finished, by_job=True)
        elif what == "committed":  # a SQL job: done with its statement's writes
            self._done(finished)
        elif what == "fenced_out":  # a SQL job whose attempt no longer ran: nothing committed
            held = running.job.held
            self._explain_fenced_out(
                [Fenced(finished, "done", self.outbox.may_have_reported(held))]
            )
        # "lost": said when the lease was found lost; "report": said once reported

    def _log_reports(self, settled: Settled) -> None:
        """Say what each applied report did (and count it for the heartbeat)."""
        for finished in settled.done:
            self._done(finished)
        for finished, failure, result in settled.failed:
            self.upkeep.jobs_failed += 1
            self.say.failed(finished, failure, result)
        for finished in settled.handed_back:
            self.say.handed_back(finished)

    def _done(self, finished: Finished, *, by_job: bool = False) -> None:
        self.upkeep.jobs_done += 1  # the next heartbeat says so
        self.say.done(finished, by_job=by_job)

    # --------------------------------------------------------- stopping

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        count = len(self.slots.running)
        # Jobs not started yet go back at once: another worker may run them
        # while ours finish.
        ahead = len(self.slots.prefetched)
        self._hand_back_prefetched()
        if self.stop.signalled(time.monotonic(), self.config.grace, count):
            self.say.stopping(name, running=count, prefetched=ahead, grace=self.config.grace)
        else:
            self.say.stopping(name, running=count, prefetched=ahead)

    def _hand_back_prefetched(self) -> None:
        """Stopping: hand the prefetched jobs back at once, without using an attempt."""
        self.outbox.hand_back(self.slots.take_prefetched())

    def _supervisor_failed(self, failure: BaseException) -> None:
        """The thread running children has failed: it reported every job it
        held as failed; report them, claim nothing more, and exit 1."""
        if self.exit_code == 0:
            self.say.error("the worker can no longer run jobs; stopping", failure)
            self.exit_code = 1
        self.stop.at_once(children_stopped=True)
        self._hand_back_prefetched()

    def _stop_children(self) -> None:
        self.stop.children_stopped = True
        for running in self.slots.running.values():
            running.stop.request("the worker is stopping")

    # ---------------------------------------------------------- listener

    def _say_deaf(self) -> None:
        every = self.config.poll if self.config.poll is not None else POLL_DEAF
        self.say.listen_unavailable(self.listen_target, every)

    def _listen_failed(self, exc: BaseException) -> None:
        self.say.debug_error("listen connection failed; polling until it is back", exc)


def _rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    # Out of the failed transaction, if the failure left one open.
    with contextlib.suppress(Exception):
        conn.rollback()


def _close_quietly(conn: psycopg.Connection[Any]) -> None:
    # A broken connection may fail to close; it is gone either way.
    with contextlib.suppress(Exception):
        conn.close()
