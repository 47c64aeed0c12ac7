"""Operator queries: what is in the queue, and the fixes for what is stuck.

The library behind `stats`, `leases`, `list`, `show`, `reap`, `requeue` and
`purge`: one function per named query of the `admin` section of
sql/queries.sql (`stats` and `purge` put several together). Jobs come back
as `Job`s; nothing here prints or exits.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgqctl.db import atomic
from pgqctl.jobs import FIELDS, FINISHED, STATUS_NAMES, Job
from pgqctl.sql import query

Connection = psycopg.Connection[Any]

# `stats` counts done jobs exactly while there are at most this many; above,
# it estimates them from the planner's statistics instead of reading history.
EXACT_DONE_BOUND = 1000


def _rows(
    conn: Connection, name: str, params: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Run a named query; each row as a dict."""
    # Always pass a dict, so `%%` in a query means `%` whether it has
    # placeholders or not.
    with atomic(conn), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query(name), dict(params or {}))
        return cur.fetchall()


# --- stats -------------------------------------------------------------------


@dataclass
class Counts:
    """Jobs of one queue (or of all) by status, plus what needs attention."""

    by_status: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUS_NAMES, 0))
    expired_leases: int = 0
    oldest_pending_age_seconds: float | None = None

    @classmethod
    def of(
        cls,
        expired_leases: int = 0,
        oldest_pending_age_seconds: float | None = None,
        **by_status: int,
    ) -> Counts:
        """Counts from keyword arguments, one per status (others 0)."""
        counts = cls(
            expired_leases=expired_leases, oldest_pending_age_seconds=oldest_pending_age_seconds
        )
        for status, n in by_status.items():
            if status not in counts.by_status:
                raise ValueError(f"unknown status {status!r}")
            counts.by_status[status] = int(n)
        return counts

    @property
    def done(self) -> int:
        return self.by_status["done"]

    @done.setter
    def done(self, n: int) -> None:
        self.by_status["done"] = n

    def not_done(self) -> int:
        """Every job but the done ones: the counts that are always exact."""
        return sum(n for status, n in self.by_status.items() if status != "done")

    def add(self, other: Counts) -> None:
        for status, n in other.by_status.items():
            self.by_status[status] += n
        self.expired_leases += other.expired_leases
        ages = [
            a
            for a in (self.oldest_pending_age_seconds, other.oldest_pending_age_seconds)
            if a is not None
        ]
        self.oldest_pending_age_seconds = max(ages) if ages else None

    def as_record(self) -> dict[str, Any]:
        """Every status's count, then expired leases and the oldest pending age."""
        return {
            **self.by_status,
            "expired_leases": self.expired_leases,
            "oldest_pending_age_seconds": self.oldest_pending_age_seconds,
        }


@dataclass
class Stats:
    totals: Counts
    queues: dict[str, Counts]
    estimated: bool  # the done counts are estimates

    def as_json(self) -> dict[str, Any]:
        """The documented JSON shape of `pgqctl stats`."""
        t = self.totals
        return {
            "totals": dict(t.by_status),
            "expired_leases": t.expired_leases,
            "oldest_pending_age_seconds": t.oldest_pending_age_seconds,
            "estimated": self.estimated,
            "queues": [{"queue": name, **c.as_record()} for name, c in self.queues.items()],
        }


@dataclass(frozen=True)
class TableEstimate:
    """What the planner's statistics say about the whole table."""

    rows: int
    analyzed: bool  # whether pg_stats has the queue column at all
    queue_shares: dict[str, float] = field(default_factory=dict)  # the most common queues
    other_share: float = 0.0  # the share of each queue not among them


def stats(conn: Connection, *, exact: bool = False) -> Stats:
    """Counts per status and queue; done is estimated on a long history unless `exact`."""
    queues = counts(conn, done_bound=None if exact else EXACT_DONE_BOUND + 1)
    estimated = not exact and sum(c.done for c in queues.values()) > EXACT_DONE_BOUND
    if estimated:
        for name, n in estimate_done(queues, table_estimate(conn)).items():
            queues.setdefault(name, Counts()).done = n
    totals = Counts()
    for c in queues.values():
        totals.add(c)
    return Stats(totals, dict(sorted(queues.items())), estimated)


def counts(conn: Connection, *, done_bound: int | None) -> dict[str, Counts]:
    """Exact counts per queue, done among at most `done_bound` jobs (None: all)."""
    found = {}
    for row in _rows(conn, "stats_counts", {"bound": done_bound}):
        found[row["queue"]] = Counts(
            {status: int(row[status]) for status in STATUS_NAMES},
            int(row["expired_leases"]),
            row["oldest_pending_age_seconds"],
        )
    return found


def table_estimate(conn: Connection) -> TableEstimate:
    """Row count and queue shares from the statistics; reads catalogs only."""
    (row,) = _rows(conn, "stats_table_estimate")
    rows = int(row["rows"])
    if not row["analyzed"]:
        return TableEstimate(rows, analyzed=False)
    shares = dict(zip(row["common_queues"] or [], row["common_shares"] or [], strict=True))
    # As the planner does for a value outside the most-common list: the rest
    # of the rows spread evenly over the other distinct values.
    n_distinct = row["n_distinct"] if row["n_distinct"] > 0 else -row["n_distinct"] * rows
    others = max(1.0, n_distinct - len(shares))
    rest = max(0.0, 1.0 - row["null_frac"] - sum(shares.values()))
    return TableEstimate(rows, True, shares, rest / others)


def estimate_done(counted: Mapping[str, Counts], table: TableEstimate) -> dict[str, int]:
    """Done jobs per queue: the queue's estimated rows less its exact other counts.

    The done jobs in `counted` come from a bounded sample: a floor for each
    queue. Before the table was ever analyzed, the estimated done total is
    split in the sample's proportions.
    """
    names = set(counted) | set(table.queue_shares)
    seen = {q: counted[q].done if q in counted else 0 for q in names}
    others = {q: counted[q].not_done() if q in counted else 0 for q in names}
    if not table.analyzed:
        total = max(sum(seen.values()), table.rows - sum(others.values()))
        sampled = sum(seen.values()) or 1
        return {q: max(seen[q], round(total * seen[q] / sampled)) for q in names}
    return {
        q: max(
            seen[q], round(table.rows * table.queue_shares.get(q, table.other_share)) - others[q]
        )
        for q in names
    }


# --- leases and reap -----------------------------------------------------------


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
    """A job as reap left it (or would leave it), and the worker that held it."""

    job: Job
    held_by: str | None

    def as_record(self) -> dict[str, Any]:
        return {**self.job.as_record(), "held_by": self.held_by}


REAP_FIELDS = (*FIELDS, "held_by")


def leases(conn: Connection, *, expired_only: bool = False) -> list[Lease]:
    """Running jobs, soonest lease end first."""
    return [
        Lease(
            Job.from_row(row),
            row["expired"],
            None if row["seconds_left"] is None else float(row["seconds_left"]),
        )
        for row in _rows(conn, "lease_list", {"expired_only": expired_only})
    ]


def reap_preview(conn: Connection) -> list[Reaped]:
    """The jobs `reap` would change now, each with the status it would get."""
    return [
        Reaped(replace(Job.from_row(row), status=row["reaped_status"]), row["held_by"])
        for row in _rows(conn, "lease_reap_preview")
    ]


def reap(conn: Connection) -> list[Reaped]:
    """Expired leases back to pending, or failed when out of attempts.

    Skips rows locked at this instant (a worker renewing or reporting), so it
    never waits on workers and concurrent reaps never take the same job.
    Workers are woken in the same transaction when a job became pending.
    """
    with conn.transaction():
        reaped = [Reaped(Job.from_row(row), row["held_by"]) for row in _rows(conn, "lease_reap")]
        if any(r.job.status == "pending" for r in reaped):
            notify_workers(conn)
    return sorted(reaped, key=lambda r: r.job.id)


def notify_workers(conn: Connection) -> None:
    """Tell listening workers there is work; sent when the transaction commits."""
    conn.execute(query("workers_notify"), {})


# --- list and show -----------------------------------------------------------------


def list_jobs(
    conn: Connection,
    *,
    status: str | None = None,
    queue: str | None = None,
    kind: str | None = None,
    limit: int = 50,
) -> list[Job]:
    """Jobs matching every filter given, newest first."""
    params = {"status": status, "queue": queue, "kind": kind, "limit": limit}
    return [Job.from_row(row) for row in _rows(conn, "job_list", params)]


def get_job(conn: Connection, job_id: int) -> Job | None:
    """One job, every column; None if there is no such job."""
    found = _rows(conn, "job_get", {"id": job_id})
    return Job.from_row(found[0]) if found else None


# --- requeue -------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which failed jobs to requeue: each filter given narrows the set."""

    ids: tuple[int, ...] = ()
    kind: str | None = None
    queue: str | None = None
    since: float | None = None  # seconds: failed within this long

    def params(self) -> dict[str, Any]:
        return {
            "ids": list(self.ids) or None,
            "kind": self.kind,
            "queue": self.queue,
            "since": None if self.since is None else dt.timedelta(seconds=self.since),
        }


@dataclass
class Requeued:
    jobs: list[Job]
    # Each --id that was not requeued, with its status (None: no such job).
    left: dict[int, str | None]


def failed_jobs(conn: Connection, selection: Selection) -> list[Job]:
    """The failed jobs a selection matches, by id."""
    return [Job.from_row(row) for row in _rows(conn, "job_failed_select", selection.params())]


def requeue(
    conn: Connection, selection: Selection, *, more: int = 1, dry_run: bool = False
) -> Requeued:
    """Move the selected failed jobs back to pending, due now, with `more` new tries.

    `attempts` is kept (it is the fencing token); `max_attempts` becomes
    attempts + more. `last_error` is kept until the next attempt replaces it.
    """
    with conn.transaction():
        matched = failed_jobs(conn, selection)
        if dry_run:
            jobs = [replace(j, status="pending", max_attempts=j.attempts + more) for j in matched]
        else:
            params = {"ids": [j.id for j in matched], "more": more}
            jobs = [Job.from_row(row) for row in _rows(conn, "job_requeue", params)]
            if jobs:
                notify_workers(conn)
    moved = {j.id for j in jobs}
    left = {}
    for job_id in selection.ids:
        if job_id not in moved:
            job = get_job(conn, job_id)
            left[job_id] = job.status if job else None
    return Requeued(sorted(jobs, key=lambda j: j.id), left)


# --- purge ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PurgePlan:
    statuses: tuple[str, ...]
    cutoff: dt.datetime  # rows finished before this instant


def purge_plan(conn: Connection, statuses: Sequence[str], older_than: float = 0.0) -> PurgePlan:
    """Fix the cutoff once, on the server's clock, so a purge always ends."""
    (row,) = _rows(conn, "job_purge_cutoff", {"older_than": dt.timedelta(seconds=older_than)})
    return PurgePlan(tuple(statuses), row["cutoff"])


def purge_count(conn: Connection, plan: PurgePlan) -> int:
    """How many rows the plan matches now."""
    (row,) = _rows(
        conn, "job_purge_count", {"statuses": list(plan.statuses), "cutoff": plan.cutoff}
    )
    return int(row["count"])


def purge_batch(conn: Connection, plan: PurgePlan, batch_size: int) -> int:
    """Delete up to `batch_size` matching rows in one short transaction."""
    params = {"statuses": list(plan.statuses), "cutoff": plan.cutoff, "batch_size": batch_size}
    with conn.transaction():
        return conn.execute(query("job_purge_batch"), params).rowcount


def purge(
    conn: Connection,
    plan: PurgePlan,
    *,
    batch_size: int = 10_000,
    on_batch: Callable[[int], None] | None = None,
) -> int:
    """Delete every row the plan matches, batch by batch; the number deleted."""
    deleted = 0
    while True:
        n = purge_batch(conn, plan, batch_size)
        deleted += n
        if on_batch and n:
            on_batch(n)
        # Fewer than a full batch: nothing unlocked is left to delete.
        if n < batch_size:
            return deleted


def purge_statuses(choices: Sequence[str]) -> list[str]:
    """The finished statuses `--status` choices name ("all": every finished one)."""
    return sorted({s for c in choices for s in (FINISHED if c == "all" else [c])})
