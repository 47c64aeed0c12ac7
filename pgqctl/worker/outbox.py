"""Finished jobs waiting to be reported, and what the exchange said of them.

No database, no logging: the loop files each finished job here (`add`
classifies it: done, failed and when it runs again, handed back), sends
`report()` with the next exchange, and hands the answer to `settle`, which
sorts the reports into applied and fenced out. A report whose exchange
failed stays for the next one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pgqctl import attempts, claims, runner
from pgqctl.claims import Failure
from pgqctl.jobs import Held
from pgqctl.worker.config import backoff_delay
from pgqctl.worker.slots import Running

# The last_error of a job handed back unfinished (the attempt not counted).
HAND_BACK_REASON = "handed back: the worker stopped before the job finished"


@dataclass(frozen=True)
class Finished:
    """A slot's result: the child's outcome, or why the payload can never run."""

    running: Running
    outcome: runner.Outcome
    rejected: str | None = None
    # A SQL job's end (pgqctl/sql_jobs.py): done in its own transaction, or
    # found no longer running (nothing committed). Nothing left to report.
    committed: bool = False
    fenced_out: bool = False
    # Seconds until the retry a resident handler asked for (None: the backoff's).
    retry_after: float | None = None
    at: float = field(default_factory=time.monotonic)  # when it ended


@dataclass
class Report:
    """The reports that go out with one exchange."""

    done: list[Finished] = field(default_factory=list)
    fails: list[tuple[Finished, Failure]] = field(default_factory=list)
    handed_back: list[Finished] = field(default_factory=list)
    # Every attempt that ended, reported or not (lost, done by the job...).
    records: list[attempts.Record] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.done or self.fails or self.handed_back or self.records)

    def finished(self) -> list[Finished]:
        return [*self.done, *(f for f, _ in self.fails), *self.handed_back]


@dataclass(frozen=True)
class Fenced:
    """A report that matched nothing: the job is no longer this attempt's."""

    finished: Finished
    tried: str  # "done", "failed", "handed back"
    # A "done" sent before on an exchange whose answer was lost: if the row
    # says done, that may be this worker's report rather than the job's.
    maybe_ours: bool = False


@dataclass
class Settled:
    """What an exchange's answer made of a report."""

    done: list[Finished] = field(default_factory=list)
    failed: list[tuple[Finished, Failure, claims.FailResult]] = field(default_factory=list)
    handed_back: list[Finished] = field(default_factory=list)
    fenced_out: list[Fenced] = field(default_factory=list)
    # Back in the queue, maybe due already: the claim that went with the
    # report could not see them (one statement, one snapshot).
    requeued: bool = False


class Outbox:
    def __init__(self, backoff: float, worker: str | None = None) -> None:
        self.backoff = backoff
        # host:pid, for the records of the attempts; None: record none (--no-history).
        self.worker = worker
        self.pending = Report()
        # Jobs whose "done" report was sent on an exchange that failed: if
        # their rows say done, that may be our report's doing, not the job's.
        self.maybe_reported: set[Held] = set()

    def __bool__(self) -> bool:
        """Whether anything waits to be reported."""
        return bool(self.pending)

    def add(self, finished: Finished) -> str:
        """File a finished job; what it needs: "report" (filed for the next
        exchange), or nothing to report: "lost" (said when the lease was found
        lost), "by_job" (the job's own transaction did it), "committed" (a SQL
        job done with its statement), "fenced_out" (a SQL job whose attempt no
        longer ran)."""
        if self.worker is not None:
            self.pending.records.append(attempt_record(finished, self.worker))
        running = finished.running
        if running.lost:
            return "lost"
        if running.completed:
            return "by_job"
        if finished.committed:
            return "committed"
        if finished.fenced_out:
            running.lost = True
            return "fenced_out"
        job = running.job
        outcome = finished.outcome
        report = self.pending
        if finished.rejected is not None:
            failure = Failure(job.id, job.attempts, finished.rejected, 0.0, permanent=True)
            report.fails.append((finished, failure))
        elif outcome.never_starts:  # no such program, arguments too long: same every time
            failure = Failure(job.id, job.attempts, outcome.last_error(), 0.0, permanent=True)
            report.fails.append((finished, failure))
        elif outcome.succeeded:
            report.done.append(finished)
        elif outcome.stopped:  # only a shutdown stops a child whose lease we hold
            report.handed_back.append(finished)
        else:
            delay = finished.retry_after
            if delay is None:
                delay = backoff_delay(job.tries, self.backoff)
            report.fails.append(
                (finished, Failure(job.id, job.attempts, outcome.last_error(), delay))
            )
        return "report"

    def hand_back(self, unstarted: list[Running]) -> None:
        """Jobs to hand back unstarted (prefetched ones, when stopping)."""
        handed_back = [Finished(r, runner.Outcome()) for r in unstarted]
        self.pending.handed_back.extend(handed_back)
        if self.worker is not None:
            self.pending.records.extend(attempt_record(f, self.worker) for f in handed_back)

    def report(self) -> Report:
        """What the next exchange reports (kept here until `settle`)."""
        return self.pending

    def unsent(self, report: Report) -> None:
        """The exchange carrying `report` failed: it stays for the next one.
        The server may have applied its "done"s with the answer lost."""
        self.maybe_reported.update(f.running.job.held for f in report.done)

    def may_have_reported(self, key: Held) -> bool:
        return key in self.maybe_reported

    def settle(self, report: Report, changed: claims.Exchanged) -> Settled:
        """The exchange carrying `report` went through: sort its reports by
        what the database did with them, and forget them."""
        if report is self.pending:
            self.pending = Report()
        settled = Settled()
        for finished in report.done:
            if finished.running.job.id in changed.done:
                settled.done.append(finished)
            else:
                held = finished.running.job.held
                settled.fenced_out.append(Fenced(finished, "done", held in self.maybe_reported))
        for finished, failure in report.fails:
            result = changed.failed.get(failure.job_id)
            if result is not None:
                settled.failed.append((finished, failure, result))
            else:
                settled.fenced_out.append(Fenced(finished, "failed"))
        for finished in report.handed_back:
            if finished.running.job.id in changed.handed_back:
                settled.handed_back.append(finished)
            else:
                settled.fenced_out.append(Fenced(finished, "handed back"))
        self.maybe_reported.clear()
        settled.requeued = bool(changed.handed_back) or any(
            r.status == "pending" for r in changed.failed.values()
        )
        return settled


def attempt_outcome(finished: Finished) -> str:
    """How the attempt ended, as attempts.outcome says it."""
    running, outcome = finished.running, finished.outcome
    if running.ended_by is not None:
        return running.ended_by
    if finished.fenced_out:
        return "lease_lost"
    if running.completed or finished.committed:
        return "done"
    if finished.rejected is not None:
        return "refused"
    if outcome.succeeded:
        return "done"
    if outcome.stopped or running.prefetched:  # a shutdown, or handed back unstarted
        return "handed_back"
    if outcome.timed_out:
        return "timed_out"
    return "failed"


def attempt_record(finished: Finished, worker: str) -> attempts.Record:
    """What the attempts table keeps of a finished attempt."""
    running, outcome = finished.running, finished.outcome
    job = running.job
    ran = finished.rejected is None and outcome.start_error is None and running.ran_in is not None
    how = attempt_outcome(finished)
    error = None
    if how != "done":
        error = finished.rejected if finished.rejected is not None else outcome.describe()
    return attempts.Record(
        job_id=job.id,
        claim=job.attempts,
        attempt=job.tries,
        worker=f"{worker}:{'prefetch' if running.ran_in is None else running.ran_in}",
        outcome=how,
        claimed=running.claimed_at or None,
        started=finished.at - outcome.duration if ran else None,
        ended=finished.at,
        exit_status=outcome.exit_code,
        signal=outcome.signal,
        error=error,
        user_cpu=outcome.cpu_user,
        system_cpu=outcome.cpu_system,
        max_rss_bytes=job_peak_memory(outcome),
        stdout_head=outcome.stdout.head if ran else None,
        stdout_tail=outcome.stdout.tail if ran else None,
        stdout_bytes=outcome.stdout.total_bytes if ran else None,
        stderr_head=outcome.stderr.head if ran else None,
        stderr_tail=outcome.stderr.tail if ran else None,
        stderr_bytes=outcome.stderr.total_bytes if ran else None,
    )


def job_peak_memory(outcome: runner.Outcome) -> int | None:
    """The peak memory of a job's process, when it is known to be the job's:
    Linux starts a child's count at the peak of the process it came from, so
    a peak no higher than this worker's own says only "at most that much"."""
    peak = outcome.max_rss_bytes
    # Our own peak only grows: read it again only for a child above the last reading.
    if peak is None or peak <= _OWN_PEAK[0]:
        return None
    _OWN_PEAK[0] = runner.own_peak_memory()
    return peak if peak > _OWN_PEAK[0] else None


# This process's peak memory as last read (a system call).
_OWN_PEAK = [0]
