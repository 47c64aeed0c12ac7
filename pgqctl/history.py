"""The history of finished jobs, in partitions by status, the done jobs' by
UTC day (see sql/migrations/0016_jobs_history.sql): filled by moving jobs out
of jobs some time after they finished; a day of done jobs is made as the
move needs it, and dropped whole once a purge's cutoff passes its end.

The move (`move`) is a chore of the workers: batches of a few thousand rows,
oldest first, each its own short transaction, for at most MOVE_BUDGET
seconds at a time so that the worker's own exchanges never wait long behind
it. A job stays in jobs for ARCHIVE_AFTER after it finished: what reads a
job just finished from jobs (a script polling its status) still finds it
there, and a drain's finishes are not followed at once by their moves.

Dropping a day takes the history's lock for an instant (ACCESS EXCLUSIVE on
jobs_history_done, not on jobs); it waits at most LOCK_WAIT for it at a
time, so that nothing queues behind the drop for longer, and tries again
after a pause, within the command's --lock-timeout.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgqctl.jobs import FINISHED
from pgqctl.rows import named_rows
from pgqctl.sql import query

# Days of partitions kept ready after today's. The move makes the days it
# needs itself; one ahead spares it that at midnight.
DAYS_AHEAD = 1
# How long a finished job stays in jobs before it moves (worker --archive-after).
ARCHIVE_AFTER = 600.0
MOVE_BATCH = 2_000
MOVE_BUDGET = 0.1
# The most days of done jobs a chore makes partitions for: a backlog that
# spans years is made a month's worth at a time, each in one transaction.
MOVE_DAYS = 31
LOCK_WAIT = 0.5
DROP_RETRY_PAUSE = 0.5


# The earliest finished_at the move takes: before it there is no day.
FLOOR = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class Moved:
    jobs: int
    more: bool  # the budget ran out with jobs left to move
    # Per status, the finished_at the next move may start from (see move).
    resume: dict[str, dt.datetime] = field(default_factory=dict)


@dataclass(frozen=True)
class DroppedDay:
    day: dt.date  # of done jobs
    rows: int | None  # by the statistics; None when never vacuumed or analyzed


def keep_ahead(conn: Any, first: dt.date | None = None) -> int:
    """Make the partitions missing from `first` (default: today, UTC, by
    the server's clock) to DAYS_AHEAD days after today; how many were made."""
    with conn.transaction():
        (row,) = conn.execute(
            query("history_add_days"), {"first": first, "ahead": DAYS_AHEAD}
        ).fetchall()
    return int(row[0])


def move(
    conn: Any,
    after: float = ARCHIVE_AFTER,
    *,
    batch_size: int = MOVE_BATCH,
    budget: float = MOVE_BUDGET,
    resume: dict[str, dt.datetime] | None = None,
) -> Moved:
    """Move the jobs that finished more than `after` seconds ago from jobs
    into the history, oldest first, batch by batch for about `budget`
    seconds; the partitions their days need, and tomorrow's, are made first.

    Each batch starts where the last one ended, and so does a move given
    the `resume` of the one before: the rows moved leave their index
    entries behind until a vacuum, and a backlog of millions walked from
    its start every time read more of them with every batch. A job that
    finished before that point since (plain SQL, a batch that rolled back)
    is moved once a move starts from the beginning: give none after a move
    that left nothing (`more` false)."""
    began = time.monotonic()
    (row,) = named_rows(conn, "history_now")
    cutoff = row["now"] - dt.timedelta(seconds=after)
    # The days the done jobs need (failed and cancelled jobs have a table
    # each), at most MOVE_DAYS of them a chore, and tomorrow's, whether or
    # not anything moves. They are made in one transaction, whose locks
    # MOVE_DAYS bounds whatever the backlog spans.
    floors = {status: FLOOR for status in FINISHED} | (resume or {})
    days = [
        r["day"]
        for r in named_rows(
            conn,
            "history_move_days",
            {"cutoff": cutoff, "floor": floors["done"], "most": MOVE_DAYS},
        )
    ]
    with conn.transaction():
        conn.execute(query("history_make_days"), {"days": days})
    keep_ahead(conn)
    cutoffs = dict.fromkeys(FINISHED, cutoff)
    capped = len(days) == MOVE_DAYS
    if capped:
        # More days wait beyond these: this chore moves the done jobs of
        # the days it made, the next makes the next ones.
        end = dt.datetime.combine(days[-1] + dt.timedelta(days=1), dt.time(), dt.timezone.utc)
        cutoffs["done"] = min(cutoff, end)
    moved = 0
    left = list(FINISHED)
    while left:
        # A batch of each status a round, whatever the budget: a backlog of
        # done jobs never keeps the failed ones waiting.
        for status in list(left):
            params = {
                "status": status,
                "cutoff": cutoffs[status],
                "floor": floors[status],
                "batch_size": batch_size,
            }
            with conn.transaction():
                (n, last) = conn.execute(query("history_move_batch"), params).fetchone()
            moved += n
            if last is not None:
                floors[status] = last
            if n < batch_size:
                left.remove(status)
        if time.monotonic() - began > budget:
            return Moved(moved, bool(left) or capped, floors)
    return Moved(moved, capped, floors)


@dataclass(frozen=True)
class State:
    oldest_in_jobs: dt.datetime | None  # the oldest finished job not moved
    now: dt.datetime

    def unmoved_for(self) -> float | None:
        """Seconds since the oldest finished job still in jobs finished."""
        if self.oldest_in_jobs is None:
            return None
        return max(0.0, (self.now - self.oldest_in_jobs).total_seconds())


def state(conn: Any) -> State:
    """How far the move is behind."""
    (row,) = named_rows(conn, "history_state")
    return State(row["oldest_in_jobs"], row["now"])


@dataclass(frozen=True)
class ReadLocks:
    """What reading a job by id locks in the history, against the server's
    lock table: every read of the history that cannot leave days out
    (show, logs, a requeue by id) takes about this many at once."""

    read_locks: int  # relations: the history's partitions and their indexes
    days: int  # partitions of done jobs
    max_locks: int  # max_locks_per_transaction
    lock_slots: int  # max_locks_per_transaction x (connections + prepared)

    def max_locks_for(self, readers: int) -> int:
        """The max_locks_per_transaction at which `readers` such reads at
        once fill at most the lock table."""
        per_slot = self.lock_slots // max(1, self.max_locks)  # connections + prepared
        return -(-self.read_locks * readers // max(1, per_slot))


def read_locks(conn: Any) -> ReadLocks:
    (row,) = named_rows(conn, "history_read_locks")
    return ReadLocks(*(int(row[k]) for k in ("read_locks", "days", "max_locks", "lock_slots")))


def days_before(conn: Any, cutoff: dt.datetime) -> list[dt.date]:
    """The days of done jobs that end by `cutoff`, oldest first."""
    return [row["day"] for row in named_rows(conn, "history_days_before", {"cutoff": cutoff})]


def drop_day(conn: Any, day: dt.date) -> DroppedDay | None:
    """Drop the day's partition of done jobs and its attempts'; None if it
    was gone already. It waits for the history's lock LOCK_WAIT at a time,
    with pauses between in which the sessions queued behind it go on, for
    as long as the transaction's lock_timeout (--lock-timeout) allows."""
    with conn.transaction():
        (limit,) = conn.execute(query("history_lock_limit")).fetchone()
    deadline = time.monotonic() + limit if limit else None

    def at_most(seconds: float) -> float:
        """`seconds`, or what is left before the deadline if less."""
        return seconds if deadline is None else min(seconds, deadline - time.monotonic())

    while True:
        wait = max(0.001, at_most(LOCK_WAIT))  # 0 would be no timeout at all
        try:
            with conn.transaction():
                conn.execute(query("history_lock_timeout"), {"timeout": f"{wait * 1000:.0f}ms"})
                (row,) = conn.execute(query("history_drop_day"), {"day": day}).fetchall()
        except psycopg.errors.LockNotAvailable:
            pause = at_most(DROP_RETRY_PAUSE)
            if pause <= 0:
                raise
            time.sleep(pause)
            continue
        if row[0] is None:
            return None
        return DroppedDay(day, None if row[0] < 0 else int(row[0]))
