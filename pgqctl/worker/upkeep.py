"""The worker's chores besides its jobs: reaping expired leases and stale
registry rows, enqueueing the schedules' due ticks, heartbeating, and moving
finished jobs into the history.

Upkeep knows when each is due and does it on the connection the loop hands
it (the loop owns the connection, and handles what a statement raises).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from pgqctl import db, history, leases, registry, ticks
from pgqctl.worker.config import WorkerConfig, jittered

# The history's move runs about this often (+-25%); again after
# ARCHIVE_AGAIN when its budget ran out with jobs left (a backlog, such as
# the history of an installation that predates it).
ARCHIVE_EVERY = 30.0
ARCHIVE_AGAIN = 1.0


class Upkeep:
    def __init__(self, config: WorkerConfig, beat: registry.Beat, now: float) -> None:
        self.config = config
        # The worker's row in `workers`; its counters change with each heartbeat.
        self.beat = beat
        self.started_at: dt.datetime | None = None  # None until registered
        # Whether any limit exists (the claim keeps them), as the last
        # heartbeat said; true until the first says otherwise.
        self.limited = True
        self.jobs_done = 0
        self.jobs_failed = 0
        self.next_heartbeat = now  # registers with the first exchange
        self.next_reap = now + jittered(config.reap_every or 0.0)
        # A --burst worker reaps once more before it decides nothing is due.
        self.burst_reaped = False
        self.ticker = ticks.Ticker(config.catch_up) if config.schedules else None
        # A --burst worker enqueues due ticks once, when it starts.
        self.burst_ticked = False
        self.archiving = config.archive_after is not None
        self.next_archive = now  # at once: a worker starting takes the backlog first
        self.archive_resume: dict[str, dt.datetime] | None = None

    # ------------------------------------------------------------ heartbeat

    def beat_due(self, now: float) -> bool:
        return now >= self.next_heartbeat

    def silent_too_long(self, now: float) -> bool:
        """Silent for three heartbeats (stopped, suspended, starved): a reap
        may have taken our jobs as a dead worker's."""
        return now >= self.next_heartbeat + (leases.STALE_AFTER - 1) * self.config.heartbeat

    def current_beat(self, running: int) -> registry.Beat:
        """This worker's row now, with `running` jobs."""
        return replace(
            self.beat,
            started_at=self.started_at,
            running=running,
            done=self.jobs_done,
            failed=self.jobs_failed,
        )

    def beaten(self, beaten: registry.Beaten, sent: float) -> None:
        """A heartbeat sent at `sent` went through and said `beaten`."""
        self.started_at = beaten.started_at
        self.limited = beaten.limited
        self.next_heartbeat = sent + self.config.heartbeat
        if beaten.dead_found and self.config.reap_every is not None:
            # A dead worker's jobs wait: reap now, not at the next --reap-every.
            self.next_reap = min(self.next_reap, sent)

    def beat_at(self, when: float) -> None:
        self.next_heartbeat = when

    def heartbeat(self, conn: db.QueueConnection, running: int, sent: float) -> None:
        """Heartbeat alone, in a statement of its own."""
        self.beaten(registry.heartbeat(conn, self.current_beat(running)), sent)

    # ---------------------------------------------------------------- ticks

    def tick_due(self) -> bool:
        if self.ticker is None:
            return False
        if self.config.burst:
            return not self.burst_ticked
        return self.ticker.due()

    def tick(self, conn: db.QueueConnection) -> list[ticks.Enqueued]:
        """Enqueue the schedules' due ticks (at most once a second)."""
        assert self.ticker is not None
        enqueued = self.ticker.check(conn)
        self.burst_ticked = True
        return enqueued

    def schedules_changed(self) -> None:
        if self.ticker is not None:
            self.ticker.changed()

    # ----------------------------------------------------------------- reap

    def reap_due(self, now: float, burst_idle: bool) -> bool:
        if self.config.reap_every is None:
            return False
        if burst_idle:
            return not self.burst_reaped
        return now >= self.next_reap

    def reap(
        self, conn: db.QueueConnection, now: float, burst_idle: bool
    ) -> tuple[list[leases.Reaped], list[str]]:
        """Reclaim expired leases, as `pgqctl reap` does, and forget workers
        gone for an hour: what it took, and whom it forgot."""
        assert self.config.reap_every is not None
        self.next_reap = now + jittered(self.config.reap_every)
        reaped = leases.reap(conn, dead_after=self.config.dead_after)
        forgotten = registry.forget_stale(conn)
        self.burst_reaped = burst_idle  # a --burst worker reaps again once back
        return reaped, forgotten

    # -------------------------------------------------------------- archive

    def archive_due(self, now: float) -> bool:
        return self.archiving and now >= self.next_archive

    def archive(self, conn: db.QueueConnection, now: float) -> history.Moved:
        """Move jobs finished --archive-after ago into the history, for a
        moment; soon again if some are left."""
        assert self.config.archive_after is not None
        self.next_archive = now + jittered(ARCHIVE_EVERY)
        moved = history.move(conn, self.config.archive_after, resume=self.archive_resume)
        # A backlog goes on where this move stopped; once none is left, the
        # next move walks from the start, for any job finished before it.
        self.archive_resume = moved.resume if moved.more else None
        if moved.more:
            self.next_archive = now + ARCHIVE_AGAIN
        return moved

    def archive_off(self) -> None:
        """This role may not write the history: move nothing more."""
        self.archiving = False

    def jobs_claimed(self) -> None:
        """A --burst worker reaps again before it decides nothing is due."""
        self.burst_reaped = False

    def reaped_last(self) -> bool:
        """Whether a --burst worker with nothing to do has reaped a last time."""
        return self.burst_reaped or self.config.reap_every is None

    def deadlines(self, stopping: bool) -> list[float]:
        """When the next chore is due."""
        due = [self.next_heartbeat]
        if self.config.reap_every is not None and not stopping:
            due.append(self.next_reap)
        if self.ticker is not None and not stopping and not self.config.burst:
            due.append(self.ticker.deadline())
        if self.archiving and not stopping:
            due.append(self.next_archive)
        return due
