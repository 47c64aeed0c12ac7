"""What the worker says: one method per event of its log.

The loop decides; the narration words it. Each method writes one event
(its name, the line for people, the fields for `--log-format json`), and a
job's fields are spelled in one place (`_job`). Nothing here changes state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pgqctl import claims, leases, payload, runner, ticks
from pgqctl.blockers import Blocker, spelled
from pgqctl.claims import Failure
from pgqctl.db import reason
from pgqctl.jobs import Job
from pgqctl.worker.config import POLL_LISTENING, WorkerConfig
from pgqctl.worker.outbox import Finished
from pgqctl.worker.slots import Running
from pgqctl.worklog import WorkLog, seconds, timestamp


def _job(job: Job, *, kind: bool = True) -> dict[str, Any]:
    """A job's fields in every event about it."""
    if kind:
        return {"job_id": job.id, "kind": job.kind, "attempt": job.tries}
    return {"job_id": job.id, "attempt": job.tries}


def _some(items: list[Any], most: int = 20) -> str:
    """The first `most` items, and how many more."""
    extra = f" and {len(items) - most} more" if items[most:] else ""
    return ", ".join(map(str, items[:most])) + extra


class Narration:
    def __init__(self, log: WorkLog, config: WorkerConfig, worker_id: str) -> None:
        self.log = log
        self.config = config
        self.worker_id = worker_id

    def error(self, message: str, exc: BaseException) -> None:
        self.log.error(message, exc)

    def debug_error(self, message: str, exc: BaseException) -> None:
        """A failure worth a line only with --debug (what follows says the rest)."""
        if self.log.debug:
            self.log.error(message, exc)

    # ------------------------------------------------------------ the worker

    def worker_started(self, target: str) -> None:
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
            + (f", database {target}" if target else ""),
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

    def worker_stopped(self, claimed: int, exit_code: int) -> None:
        self.log.event(
            "worker_stopped",
            f"worker {self.worker_id} stopped after {claimed} job(s)",
            jobs=claimed,
            exit_code=exit_code,
        )

    def guard_lost(self, pid: int | None) -> None:
        self.log.event(
            "guard_lost",
            f"guard process {pid} is gone (killed, or stopped and given up): "
            "if this worker dies now, its jobs run on; restart the worker to get one back",
            guard_pid=pid,
        )

    def stopping(
        self, name: str, *, running: int, prefetched: int, grace: float | None = None
    ) -> None:
        """A signal: with `grace`, waiting for the running jobs; else stopping them now."""
        back = f"; handing back {prefetched} prefetched job(s)" if prefetched else ""
        if grace is not None:
            self.log.event(
                "stopping",
                f"{name}: claiming no more jobs{back}; waiting up to "
                f"{seconds(grace)} for {running} running job(s) "
                "(signal again to stop them now)",
                signal=name,
                running=running,
                prefetched=prefetched,
                grace=grace,
            )
            return
        self.log.event(
            "stopping",
            (f"{name}: stopping {running} running job(s) now" if running else f"{name}: stopping")
            + back,
            signal=name,
            running=running,
            prefetched=prefetched,
        )

    def listen_unavailable(self, target: str, every: float) -> None:
        self.log.event(
            "listen_unavailable",
            f"notifications cannot be heard through {target} (a transaction "
            f"pooler): looking for jobs every {seconds(every)} instead; give --listen-dsn "
            "a direct or session-pooled connection to wake on new jobs at once",
            target=target,
            poll=every,
        )

    # -------------------------------------------------------------- upkeep

    def scheduled(self, enqueued: list[ticks.Enqueued]) -> None:
        """One line for the whole statement, however many schedules ticked."""
        made = [
            (e.schedule, payload.iso_utc(t), i)
            for e in enqueued
            for t, i in zip(e.ticks, e.jobs, strict=True)
        ]
        parts = [f"{name} {tick} as job {i}" for name, tick, i in made]
        self.log.event(
            "scheduled",
            f"enqueued {len(made)} schedule tick(s): {_some(parts)}",
            ticks=[{"schedule": n, "tick": t, "job_id": i} for n, t, i in made],
        )

    def schedule_skipped(self, skipped: list[ticks.Enqueued]) -> None:
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

    def workers_forgotten(self, forgotten: list[str]) -> None:
        self.log.event(
            "workers_forgotten",
            f"removed {len(forgotten)} worker(s) not seen for an hour from workers: "
            + ", ".join(forgotten),
            workers=forgotten,
        )

    def archived(self, jobs: int) -> None:
        self.log.event(
            "archived", f"moved {jobs} finished job(s) from jobs into the history", jobs=jobs
        )

    def archive_refused(self, exc: BaseException) -> None:
        self.log.error(
            "cannot move finished jobs into the history (they stay in jobs; grant this role "
            "SELECT, INSERT, UPDATE, DELETE on jobs_history and attempts_history, or run "
            "with --no-archive)",
            exc,
        )

    def reaped(self, reaped: list[leases.Reaped]) -> None:
        ids = [r.job.id for r in reaped]
        failed = [r.job.id for r in reaped if r.job.status == "failed"]
        holders = sorted({r.held_by or "an unnamed worker" for r in reaped})
        dead = sorted({(r.held_by or "").rpartition(":")[0] for r in reaped if r.reason == "dead"})
        what = f"{len(ids)} expired lease(s)"
        if dead:
            of_dead = sum(r.reason == "dead" for r in reaped)
            what = f"{len(ids)} job(s) ({of_dead} of dead worker(s) {', '.join(dead)})"
        self.log.event(
            "reaped",
            f"reaped {what} (job {_some(ids)}) held by "
            f"{', '.join(holders)}: {len(ids) - len(failed)} back to pending, "
            f"{len(failed)} failed (out of attempts)",
            jobs=ids,
            failed=failed,
            held_by=holders,
            dead_workers=dead,
        )

    # ------------------------------------------------------------ the database

    def db_restored(self, down: float) -> None:
        self.log.event(
            "db_restored",
            f"database connection restored after {seconds(down)}",
            downtime=round(down, 3),
        )

    def db_conflict(self, exc: BaseException) -> None:
        self.log.event(
            "db_conflict",
            f"transaction rolled back by a conflict ({reason(exc)}); retrying",
            error=reason(exc),
        )

    def db_lost(self, what: str, exc: BaseException, *, running: int, unreported: int) -> None:
        self.log.event(
            "db_lost",
            f"{what}: {reason(exc)}; retrying with backoff ({running} job(s) "
            f"keep running; their results and {unreported} finished job(s) are reported "
            "once it is back)",
            error=reason(exc),
            running=running,
            unreported=unreported,
        )

    def db_blocked(
        self, exc: BaseException, kind: str, limit: float, blocker: Blocker | None
    ) -> None:
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

    def server_refused(
        self, exc: BaseException, delay: float, *, running: int, unreported: int
    ) -> None:
        sqlstate = getattr(exc, "sqlstate", None)
        self.log.event(
            "server_refused",
            f"the server refused: {reason(exc)} (SQLSTATE {sqlstate}); retrying in "
            f"{seconds(delay)} ({running} job(s) keep running; their results and "
            f"{unreported} finished job(s) are reported once it accepts them)",
            error=reason(exc),
            sqlstate=sqlstate,
            retry_in=round(delay, 3),
            running=running,
            unreported=unreported,
        )

    def db_refused(self, message: str) -> None:
        self.log.event("db_refused", f"{message}; stopping", error=message)

    def unreported(self, ids: list[int]) -> None:
        self.log.event(
            "unreported",
            f"could not report {len(ids)} job(s) ({_some(ids)}): the database is unreachable; "
            "they return to the queue when their leases expire (`pgqctl reap`)",
            jobs=ids,
        )

    # ---------------------------------------------------------------- jobs

    def started(self, running: Running, *, pid: int | None = None, backend_pid: int = 0) -> None:
        """A job's process exists (`pid`), or its SQL is about to run (`backend_pid`)."""
        job = running.job
        where = f"pid {pid}" if pid is not None else f"SQL on backend pid {backend_pid}"
        self.log.event(
            "started",
            f"job {job.id} started: {job.kind}, attempt {job.tries} of {job.max_attempts} "
            f"(queue {job.queue}, slot {running.slot}, {where})",
            job_id=job.id,
            kind=job.kind,
            queue=job.queue,
            attempt=job.tries,
            max_attempts=job.max_attempts,
            slot=running.slot,
            **({"pid": pid} if pid is not None else {"backend_pid": backend_pid}),
        )

    def forwarder(self, job_id: int) -> Callable[[str], None]:
        """What writes each line of a job's output to the log."""
        event = self.log.event

        def forward(line: str) -> None:
            event("output", f"job {job_id} | {line}", job_id=job_id, line=line)

        return forward

    def output_left_out(self, job_id: int, outcome: runner.Outcome) -> None:
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

    def done(self, finished: Finished, *, by_job: bool = False) -> None:
        """A job done: by this worker's report, or (`by_job`) by the job's own
        transaction, after which its program may still have failed or been
        stopped: the job stays done, and the log says how the program ended."""
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
        self.log.event("done", text, **_job(job), duration=round(duration, 3), **fields)

    def failed(self, finished: Finished, failure: Failure, result: claims.FailResult) -> None:
        """A reported failure: for good ("failed"), or to run again ("retry")."""
        job = finished.running.job
        outcome = finished.outcome
        what = finished.rejected or outcome.describe()
        fields: dict[str, Any] = {
            **_job(job),
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

    def handed_back(self, finished: Finished) -> None:
        job = finished.running.job
        prefetched = finished.running.prefetched
        what = "not started (prefetched)" if prefetched else "stopped by the shutdown"
        self.log.event(
            "handed_back",
            f"job {job.id} handed back: attempt {job.tries} {what}; it runs again "
            "without using up an attempt",
            **_job(job, kind=False),
            prefetched=prefetched,
        )

    def completed_by_job(self, running: Running) -> None:
        job = running.job
        self.log.event(
            "completed_by_job",
            f"job {job.id} done by its own transaction (attempt {job.tries}); "
            "its program runs on until it exits",
            **_job(job),
        )

    def cancelled(self, running: Running, error: str | None, noticed: str) -> None:
        """An operator cancelled a job this worker held (told by a
        notification or the renewal): stopped, or dropped unstarted."""
        job = running.job
        if running.prefetched:
            what = f" before it started (prefetched): attempt {job.tries} dropped"
        else:
            what = f": stopping attempt {job.tries}"
        self.log.event(
            "cancelled",
            f"job {job.id} cancelled ({error or 'by an operator'}){what}; it is not retried",
            **_job(job),
            reason=error,
            noticed=noticed,
            **({"prefetched": True} if running.prefetched else {}),
        )

    def cancelled_before_report(self, job: Job, tried: str) -> None:
        self.log.event(
            "cancelled",
            f"job {job.id} cancelled while attempt {job.tries} ran; its result ({tried}) dropped",
            **_job(job),
            dropped=tried,
            noticed="report",
        )

    def lease_lost(self, running: Running) -> None:
        """The renewal found a job's lease gone: stopped, or dropped unstarted."""
        job = running.job
        if running.prefetched:
            self.log.event(
                "lease_lost",
                f"job {job.id} lease lost before it started (prefetched): "
                f"attempt {job.tries} is no longer this worker's; dropped",
                **_job(job, kind=False),
                reason="renewal",
                prefetched=True,
            )
            return
        self.log.event(
            "lease_lost",
            f"job {job.id} lease lost: attempt {job.tries} is no longer this worker's "
            "(reaped or taken over); stopping it, its result will be dropped",
            **_job(job, kind=False),
            reason="renewal",
        )

    def fenced_out(self, job: Job, tried: str, status: str, attempts: int, held: bool) -> None:
        """A report matched nothing, and the job's row (`status`, `attempts`;
        `held`: whether it could be read) says why."""
        if not held:
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
            **_job(job, kind=False),
            dropped=tried,
            status=status or None,
            attempts=attempts if status else None,
        )
