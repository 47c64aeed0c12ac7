"""Jobs this worker holds that ended without it, and how it finds out.

A job may end while the worker holds it: an operator cancels it (the
database already says cancelled, fenced like a report), its program
completes it in its own transaction, or another worker's reap takes it
(the lease is lost). The worker hears of it from a cancel notification,
from a renewal that no longer matches the job, or from a report fenced
out; in each case it reads the job's row before acting (anyone connected
may send a notification), then stops what still runs and says why.

The loop hands these checks its connection; a failed statement raises
psycopg's error, for the loop to handle (the checks are asked again).
"""

from __future__ import annotations

from collections.abc import Iterable

import psycopg

from pgqctl import claims, db
from pgqctl.errors import PgqctlError
from pgqctl.jobs import Held
from pgqctl.worker.narration import Narration
from pgqctl.worker.outbox import Fenced, Finished
from pgqctl.worker.slots import Running, Slots


class EndedElsewhere:
    def __init__(self, slots: Slots, say: Narration) -> None:
        self.slots = slots
        self.say = say
        # Held jobs a notification says were cancelled: checked, then stopped.
        self.notices: set[Held] = set()

    def noticed(self, held: Iterable[Held]) -> None:
        """A cancel notification named these jobs; those this worker holds are checked."""
        self.notices.update(key for key in held if self.slots.holding(key))

    def check_notices(self, conn: db.QueueConnection) -> None:
        """Stop the held jobs a notification said were cancelled, once their
        rows confirm it."""
        held = [k for k in self.notices if self.slots.holding(k)]
        self.notices.clear()
        if not held:
            return
        try:
            found = claims.ended(conn, held)
        except (psycopg.Error, PgqctlError):
            self.notices.update(held)  # asked again once reconnected
            raise
        for key in held:
            running = self.slots.holding(key)
            status, why = found.get(key[0], ("", None))
            if running is not None and status == "cancelled":
                self._stop_cancelled(running, why, "notification")

    def check_renewal(self, conn: db.QueueConnection, held: list[Held], kept: set[int]) -> None:
        """The renewal of `held` kept only `kept`: find out why each of the
        others ended, and stop what still runs for nothing."""
        gone = [key for key in held if key[0] not in kept and self.slots.holding(key)]
        if not gone:
            return
        # Lost, cancelled by an operator (also without a notification,
        # through a transaction pooler), or done by the job's own
        # transaction: the job's row tells which.
        try:
            ended = claims.ended(conn, gone)
        except (psycopg.Error, PgqctlError):
            ended = {}  # said as a lost lease; either way the job is stopped
        for key in gone:
            running = self.slots.holding(key)
            if running is None:
                continue
            status, why = ended.get(key[0], ("", None))
            if status == "cancelled":
                self._stop_cancelled(running, why, "renewal")
            elif status == "done" and not running.prefetched:
                # Its program committed its own "done" and runs on: let it
                # finish, with nothing left to renew or report.
                running.completed = True
                self.say.completed_by_job(running)
            else:
                self.say.lease_lost(running)
                self._drop(running, "lease lost", "lease_lost")

    def explain_fenced_out(
        self, conn: db.QueueConnection, fenced_out: list[Fenced]
    ) -> list[tuple[Finished, bool]]:
        """Say why reports matched nothing: the job was taken over, reaped,
        cancelled or deleted. Returns those that are done after all, each
        with whether the job's own transaction did it (rather than an earlier
        report of ours whose answer the connection lost)."""
        try:
            state = claims.fence_state(conn, [f.finished.running.job.id for f in fenced_out])
        except (psycopg.Error, PgqctlError):
            state = {}  # explained below as "no longer held"; the next step reconnects
        done = []
        for fenced in fenced_out:
            finished, tried = fenced.finished, fenced.tried
            job = finished.running.job
            status, attempts = state.get(job.id, ("", -1))
            if status == "done" and attempts == job.attempts:
                done.append((finished, not (tried == "done" and fenced.maybe_ours)))
            elif status == "cancelled" and attempts == job.attempts:
                # An operator cancelled it before the report came in.
                self.say.cancelled_before_report(job, tried)
            else:
                self.say.fenced_out(job, tried, status, attempts, held=bool(state))
        return done

    def _stop_cancelled(self, running: Running, error: str | None, noticed: str) -> None:
        """An operator cancelled a job this worker runs: stop its process
        group (SIGTERM, then SIGKILL) and drop its result; the database
        already says cancelled."""
        self.say.cancelled(running, error, noticed)
        self._drop(running, "cancelled", "cancelled")

    def _drop(self, running: Running, why: str, ended_by: str) -> None:
        """Stop a job's process and drop its result (its attempt is recorded
        as `ended_by`); a prefetched one leaves the local queue unstarted."""
        running.ended_by = ended_by
        if running.prefetched:
            self.slots.drop_prefetched(running)
        else:
            running.lost = True
            running.stop.request(why)
