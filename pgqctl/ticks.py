"""The worker's side of schedules: enqueue due ticks, with no leader.

Every worker (without --no-schedules) keeps the schedules in memory, read
from the database when they change (a notification on pgqctl_schedules
from `schedule add`, `sync`, `remove`...) and every REFRESH seconds anyway.
It works out each schedule's due ticks itself, with the cron library
(pgqctl/schedules.py), and at most once a second, when a tick is due,
enqueues them all in one statement (``ticks_enqueue`` in
sql/queries/ticks.sql). That statement, not the worker, decides: however many
workers send the same tick at once, the schedule's row lock, its last_tick
and the unique (schedule, tick) index leave one job. A worker that loses
the race learns the schedule's last tick from the answer and moves on. The
same statement applies a schedule's overlap policy: with `skip`, a tick due
while the previous tick's job is pending or running is skipped (counted on
the schedule), so a slow job never piles up a backlog of itself.

Times are the database's: the workers' clocks may differ, so the worker
reads the database's now() with the schedules and counts from there on its
monotonic clock. Nothing here runs per job. Nothing here prints.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pgqctl.db import QueueConnection
from pgqctl.schedules import CATCH_UP_MAX, Timing, due_ticks
from pgqctl.sql import query

# Read the schedules again at least this often, should a notification be
# missed (a transaction pooler hears none).
REFRESH = 10.0
# Look for due ticks at most this often.
CHECK_EVERY = 1.0


@dataclass
class _Cached:
    name: str
    timing: Timing
    paused: bool
    version: dt.datetime  # updated_at: the definition the worker read
    after: dt.datetime  # ticks up to here are done with
    broken: bool = False  # an expression or zone the library refuses here


@dataclass(frozen=True)
class Enqueued:
    """A schedule's ticks a worker enqueued: job ids and ticks, in order; and
    the ticks it skipped (overlap skip: the previous tick's job had not ended)."""

    schedule: str
    jobs: tuple[int, ...]
    ticks: tuple[dt.datetime, ...]
    skipped: tuple[dt.datetime, ...] = ()


@dataclass
class Ticker:
    """What a worker knows of the schedules, and when it next looks."""

    catch_up: str = "latest"
    clock: Callable[[], float] = time.monotonic
    schedules: dict[str, _Cached] = field(default_factory=dict)
    # The database's time at the monotonic time `read_at`.
    db_now: dt.datetime | None = None
    read_at: float = 0.0
    stale: bool = True  # read the schedules before the next check
    next_check: float = 0.0
    next_tick: float | None = None  # monotonic time of the earliest tick to come

    def changed(self) -> None:
        """A notification: the schedules changed; read them before the next check."""
        self.stale = True
        self.next_check = min(self.next_check, self.clock())

    def deadline(self) -> float:
        """When the worker should next call `check` (monotonic)."""
        at = self.read_at + REFRESH
        if self.stale:
            at = min(at, self.next_check)
        if self.next_tick is not None:
            at = min(at, max(self.next_tick, self.next_check))
        return at

    def due(self) -> bool:
        return self.clock() >= self.deadline()

    def now(self) -> dt.datetime:
        assert self.db_now is not None
        return self.db_now + dt.timedelta(seconds=self.clock() - self.read_at)

    def check(self, conn: QueueConnection) -> list[Enqueued]:
        """Read the schedules if need be, and enqueue the due ticks in one
        statement; what this worker enqueued. Raises what the connection raises."""
        started = self.clock()
        self.next_check = started + CHECK_EVERY
        if self.stale or started >= self.read_at + REFRESH:
            self._read(conn)
        wanted = self._due()
        enqueued: list[Enqueued] = []
        if wanted:
            enqueued = self._enqueue(conn, wanted)
        self._plan()
        return enqueued

    def _read(self, conn: QueueConnection) -> None:
        sent = self.clock()
        with conn.transaction():
            rows = conn.execute(query("ticks_schedules")).fetchall()
        # Half the round trip: when the database read its clock, about.
        self.read_at = (sent + self.clock()) / 2
        self.stale = False
        fresh: dict[str, _Cached] = {}
        for name, cron, every, zone, paused, version, after, now in rows:
            self.db_now = now
            if name is None:
                continue
            fresh[name] = _Cached(name, Timing(cron, every, zone), paused, version, after)
        self.schedules = fresh

    def _due(self) -> list[dict[str, str]]:
        now = self.now()
        wanted = []
        for s in self.schedules.values():
            if s.paused or s.broken:
                continue
            try:
                ticks = due_ticks(s.timing, s.after, now, self.catch_up, bound=CATCH_UP_MAX)
            except Exception:  # stored by hand with an expression the library refuses
                s.broken = True
                continue
            version = s.version.isoformat()
            wanted += [{"name": s.name, "version": version, "tick": t.isoformat()} for t in ticks]
        return wanted

    def _enqueue(self, conn: QueueConnection, wanted: list[dict[str, str]]) -> list[Enqueued]:
        with conn.transaction():
            rows = conn.execute(query("ticks_enqueue"), {"ticks": json.dumps(wanted)}).fetchall()
        answered = set()
        enqueued = []
        for name, version, after, jobs, ticks, skipped in rows:
            answered.add(name)
            cached = self.schedules.get(name)
            if cached is None:
                continue
            if version != cached.version:
                self.stale = True  # changed since read: read it again
            if after is not None and after > cached.after:
                cached.after = after
            if jobs or skipped:
                enqueued.append(Enqueued(name, tuple(jobs), tuple(ticks), tuple(skipped)))
        if any(w["name"] not in answered for w in wanted):
            self.stale = True  # removed since read
        return enqueued

    def _plan(self) -> None:
        """When the earliest tick to come is due, on the monotonic clock."""
        if self.db_now is None:
            self.next_tick = None
            return
        now = self.now()
        soonest: dt.datetime | None = None
        for s in self.schedules.values():
            if s.paused or s.broken:
                continue
            try:
                # The first tick not done with: due already when this
                # worker's statement could not take it (another worker was
                # ticking), and then looked at again a second later.
                tick = s.timing.next_after(s.after)
            except Exception:
                s.broken = True
                continue
            if soonest is None or tick < soonest:
                soonest = tick
        self.next_tick = None if soonest is None else self.clock() + (soonest - now).total_seconds()
