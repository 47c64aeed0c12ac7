"""What a job is: one row of `jobs`, and the statuses it moves through.

The state machine lives here and nowhere else: the `--status` choices
(those of `cancel` too), `stats`, `purge` and the table of statuses
in docs/table.md all read `STATUSES`, and
a test checks it against the table's CHECK constraint. A new status is one
more entry here, plus the migration that lets the table hold it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from pgqctl.rows import shown

# (job id, the attempt a worker claimed): what every fence checks.
Held = tuple[int, int]


@dataclass(frozen=True)
class Move:
    """One way out of a status: to `to` (a status, or "deleted"), made by `by`, when `when`."""

    to: str
    by: str
    when: str


@dataclass(frozen=True)
class Status:
    name: str
    meaning: str
    finished: bool  # has finished_at set, and is what purge deletes
    moves: tuple[Move, ...]


STATUSES: tuple[Status, ...] = (
    Status(
        "pending",
        "waiting to run, from run_at on",
        finished=False,
        moves=(
            Move("running", "worker", "claims it (due, highest priority first)"),
            Move("cancelled", "cancel", "an operator cancels it"),
            Move("pending", "requeue", "an operator makes it due now (never later than it was)"),
        ),
    ),
    Status(
        "running",
        "a worker holds it under a lease (locked_until, locked_by)",
        finished=False,
        moves=(
            Move("done", "worker", "the job exits 0, or its SQL handler's statement commits"),
            Move("done", "the job", "its program commits pgqctl_complete_job with its own writes"),
            Move("pending", "worker", "the job fails with attempts left (due after a backoff)"),
            Move("failed", "worker", "the job fails with no attempts left, or can never run"),
            Move("pending", "worker", "it stops before the job ends (handed back: not a try)"),
            Move("pending", "reap", "its lease expired or its worker is dead, with attempts left"),
            Move("failed", "reap", "its lease expired or its worker is dead, no attempts left"),
            Move("cancelled", "cancel", "an operator cancels it (its worker stops the job)"),
        ),
    ),
    Status(
        "done",
        "finished: the job exited 0, or committed its own done",
        finished=True,
        moves=(Move("deleted", "purge", "it finished before --older-than"),),
    ),
    Status(
        "failed",
        "finished for good: out of attempts, or it can never run (the dead letters)",
        finished=True,
        moves=(
            Move("pending", "requeue", "an operator grants it more attempts"),
            Move("deleted", "purge", "--status failed, finished before --older-than"),
        ),
    ),
    Status(
        "cancelled",
        "finished: an operator cancelled it (last_error says why); no worker claims it",
        finished=True,
        moves=(
            Move("pending", "requeue", "an operator brings it back"),
            Move("deleted", "purge", "--status cancelled, finished before --older-than"),
        ),
    ),
)

STATUS_NAMES: tuple[str, ...] = tuple(s.name for s in STATUSES)
FINISHED: tuple[str, ...] = tuple(s.name for s in STATUSES if s.finished)
# What `cancel` takes: the statuses an operator's cancel moves a job out of.
CANCELLABLE: tuple[str, ...] = tuple(
    s.name for s in STATUSES if any(m.by == "cancel" for m in s.moves)
)
# What `requeue` takes: the statuses it moves a job out of.
REQUEUED: tuple[str, ...] = tuple(
    s.name for s in STATUSES if any(m.by == "requeue" for m in s.moves)
)


@dataclass(frozen=True, slots=True)
class Job:
    """One row of `jobs`. A claim reads only the columns a worker needs; the
    others keep their defaults there."""

    id: int
    queue: str
    kind: str
    payload: Any
    status: str = "pending"
    priority: int = 0
    # The fencing token: every claim increments it, nothing decreases it.
    attempts: int = 0
    max_attempts: int = 3
    run_at: datetime | None = None
    locked_until: datetime | None = None
    locked_by: str | None = None
    last_error: str | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None
    # Claims handed back unfinished when a worker stopped: not tries.
    handbacks: int = 0
    # At most one pending or running job per (queue, unique_key); None: no key.
    unique_key: str | None = None
    # The schedule that enqueued it and the tick it is for (None: not a tick).
    schedule: str | None = None
    tick: datetime | None = None
    # When the last claim took it (None before the first): a running job runs since then.
    claimed_at: datetime | None = None
    # The key of per-key limits (`enqueue --limit-key`), and whether the job
    # holds seats of limits now (`pgqctl limit`).
    limit_key: str | None = None
    seated: bool | None = None
    # Why `payload` holds the payload's JSON text rather than its value (cut,
    # or nested too deep to decode): None when it is the value. Read
    # commands cut a payload and a last_error too long to show (rows.py).
    payload_note: str | None = None
    payload_cut: bool = False
    last_error_cut: bool = False

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Job:
        """A job from a row of `SELECT *`, or of the bounded `{job}` columns
        (more keys than columns are ignored)."""
        found = {name: row[name] for name in FIELDS if name in row}
        if "payload_head" in row:
            bounded = shown(row)
            found.update({f.name: getattr(bounded, f.name) for f in fields(bounded)})
        return cls(**found)

    @property
    def tries(self) -> int:
        """The tries this job has used (the running one included), of
        max_attempts: its claims less those handed back unfinished."""
        return self.attempts - self.handbacks

    @property
    def held(self) -> Held:
        """What fences this claim: (id, the attempt claimed)."""
        return (self.id, self.attempts)

    def as_record(self) -> dict[str, Any]:
        """The job object of the JSON output: every column, in table order."""
        return {name: getattr(self, name) for name in FIELDS}


# A job's fields in machine output, the table's columns in order.
FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Job))
