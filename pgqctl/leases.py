"""Leases and reap: the running jobs and where their leases stand, and
taking back the jobs of expired leases and dead workers.

The library behind `pgqctl leases` and `pgqctl reap`, and what a worker's
own reaping calls (pgqctl/worker/upkeep.py); its SQL is
sql/queries/leases.sql. Nothing here prints or exits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import psycopg

from pgqctl import flow
from pgqctl.admin import notify_workers
from pgqctl.db import atomic
from pgqctl.errors import BadInput
from pgqctl.jobs import FIELDS, Job
from pgqctl.rows import named_rows

Connection = psycopg.Connection[Any]


@dataclass(frozen=True)
class Lease:
    """A running job and where its lease stands."""

    job: Job
    expired: bool  # over, or no lease at all: what reap takes
    seconds_left: float | None  # negative when overdue; None without a lease

    def as_record(self) -> dict[str, Any]:
        return {**self.job.as_record(), "expired": self.expired, "seconds_left": self.seconds_left}


LEASE_FIELDS = (*FIELDS, "expired", "seconds_left")


@dataclass(frozen=True)
class Reaped:
    """A job as reap left it (or would leave it), the worker that held it,
    and why it was taken: its lease expired (`expired`), its worker was dead
    (`dead`), or the operator named its worker (`asked`, `reap --worker`)."""

    job: Job
    held_by: str | None
    reason: str = "expired"

    def as_record(self) -> dict[str, Any]:
        return {**self.job.as_record(), "held_by": self.held_by, "reason": self.reason}


REAP_FIELDS = (*FIELDS, "held_by", "reason")

# A worker whose row has seen no heartbeat for this many of its own
# heartbeat intervals is dead: reap takes its jobs without waiting for their
# leases. It shows stale after three; three more are its time to come back
# (a pause of its host, a database that restarted, a reconnection's backoff).
DEAD_AFTER = 6
# `reap --worker` takes a worker's jobs once its row is stale: no heartbeat
# for this many of its intervals, as `pgqctl workers` shows it.
STALE_AFTER = 3


def leases(conn: Connection, *, expired_only: bool = False) -> list[Lease]:
    """Running jobs, soonest lease end first."""
    return [
        Lease(
            Job.from_row(row),
            row["expired"],
            None if row["seconds_left"] is None else float(row["seconds_left"]),
        )
        for row in named_rows(conn, "lease_list", {"expired_only": expired_only})
    ]


def reap_preview(
    conn: Connection, *, dead_after: int = DEAD_AFTER, worker: str | None = None
) -> list[Reaped]:
    """The jobs `reap` would change now, each with the status and the
    last_error it would get."""
    with atomic(conn):
        if worker is not None:
            _check_reapable(conn, worker)
        rows = named_rows(conn, "lease_reap_preview", _reap_params(dead_after, worker))
    return [
        Reaped(
            replace(
                Job.from_row(row),
                status=row["reaped_status"],
                last_error=row["reaped_error"],
                last_error_cut=False,
            ),
            row["held_by"],
            row["reason"],
        )
        for row in rows
    ]


def reap(
    conn: Connection, *, dead_after: int = DEAD_AFTER, worker: str | None = None
) -> list[Reaped]:
    """Expired leases, and the jobs of dead workers, back to pending, or
    failed when out of attempts.

    A worker is dead when its row in `workers` has seen no heartbeat for
    `dead_after` of its heartbeat intervals (while the server was up); its
    jobs are taken whatever their leases say, and its row is marked
    (reaped_at). With `worker` (host:pid), only that worker's jobs, as soon
    as its row is stale; BadInput when it is active or not registered.

    Skips rows locked at this instant (a worker renewing, reporting or
    heartbeating), so it never waits on workers and concurrent reaps never
    take the same job. The seats of limits held for jobs that no longer run
    are freed (flow.free_lost_seats). Workers are woken in the same
    transaction when a job became pending or a seat free.
    """
    with conn.transaction():
        if worker is not None:
            _check_reapable(conn, worker)
        reaped = [
            Reaped(Job.from_row(row), row["held_by"], row["reason"])
            for row in named_rows(conn, "lease_reap", _reap_params(dead_after, worker))
        ]
        freed = flow.free_lost_seats(conn)
        if freed or any(r.job.status == "pending" for r in reaped):
            notify_workers(conn)
    return sorted(reaped, key=lambda r: r.job.id)


def check_dead_after(dead_after: int) -> None:
    """BadInput for a rule that would take a worker for dead before it shows stale."""
    if dead_after < STALE_AFTER:
        raise BadInput(
            f"--dead-after must be at least {STALE_AFTER} heartbeats (a worker shows stale "
            f"after {STALE_AFTER}), e.g. --dead-after {DEAD_AFTER}"
        )


def _reap_params(dead_after: int, worker: str | None) -> dict[str, Any]:
    check_dead_after(dead_after)
    return {"dead_after": dead_after, "worker": worker}


def _check_reapable(conn: Connection, worker: str) -> None:
    """BadInput unless `worker` is registered and stale: the jobs of a
    worker that heartbeats are its own, and taking them would run them twice."""
    rows = named_rows(conn, "worker_get", {"id": worker})
    if not rows:
        raise BadInput(
            f"no worker {worker!r} in the registry: `pgqctl workers` lists them by "
            "host:pid (its jobs' leases still expire by themselves)"
        )
    row = rows[0]
    if row["active"]:
        raise BadInput(
            f"worker {worker} is active (last heartbeat {row['seen_seconds_ago']:.0f}s ago, "
            f"every {row['heartbeat_seconds']:g}s): stop it, or wait until `pgqctl workers` "
            "shows it stale"
        )
