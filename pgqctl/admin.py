"""Operator queries: what is in the queue, and the fixes for what is stuck.

The library behind `stats`, `list`, `show`, `requeue`, `cancel` and
`purge` (`leases` and `reap`: pgqctl/leases.py): one function per named query of
sql/queries/admin.sql (`stats` and `purge` put several together). Jobs come back
as `Job`s; nothing here prints or exits.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from pgqctl import flow, history
from pgqctl.control import Pause, paused
from pgqctl.db import batch_across, in_batches, window_start
from pgqctl.errors import BadInput, PgqctlError
from pgqctl.jobs import CANCELLABLE, FIELDS, FINISHED, STATUS_NAMES, Job
from pgqctl.rows import READ_PARAMS, job_rows, named_rows, with_job_columns
from pgqctl.sql import query

Connection = psycopg.Connection[Any]

# `stats` counts done jobs exactly while there are at most this many; above,
# it estimates them from the planner's statistics instead of reading history.
EXACT_DONE_BOUND = 1000


# --- stats -------------------------------------------------------------------


@dataclass
class Counts:
    """Jobs of one queue (or of all) by status, plus what needs attention."""

    by_status: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUS_NAMES, 0))
    expired_leases: int = 0
    oldest_pending_age_seconds: float | None = None
    # How the done count is known: "exact", "estimated" (to within a factor
    # of 2), or "unknown" (the statistics cannot tell; by_status holds a floor).
    done_figure: str = "exact"
    # The pending jobs whose run_at has come (the others wait for it).
    due: int = 0

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
        self.due += other.due
        ages = [
            a
            for a in (self.oldest_pending_age_seconds, other.oldest_pending_age_seconds)
            if a is not None
        ]
        self.oldest_pending_age_seconds = max(ages) if ages else None

    @property
    def estimated(self) -> bool:
        return self.done_figure != "exact"

    def shown_done(self) -> int | None:
        """The done count as shown: None when the statistics cannot tell it."""
        return None if self.done_figure == "unknown" else self.done

    def as_record(self) -> dict[str, Any]:
        """Every status's count (done None when unknown), then expired leases,
        the oldest pending age and whether done is estimated."""
        return {
            **self.by_status,
            "done": self.shown_done(),
            "expired_leases": self.expired_leases,
            "oldest_pending_age_seconds": self.oldest_pending_age_seconds,
            "estimated": self.estimated,
        }


@dataclass
class Stats:
    totals: Counts
    queues: dict[str, Counts]
    estimated: bool  # the done counts are estimates
    # The pauses in effect, by queue (each of them also in `queues`).
    paused: dict[str, Pause] = field(default_factory=dict)
    # The limits (`pgqctl limit`), with what runs and waits under each.
    limits: list[flow.Limit] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The documented JSON shape of `pgqctl stats`: each queue says
        whether its done count is estimated, and gives null for one the
        statistics cannot tell, and its pause (null when not paused); the
        pauses are also listed on their own."""
        t = self.totals
        return {
            "totals": dict(t.by_status),
            "expired_leases": t.expired_leases,
            "oldest_pending_age_seconds": t.oldest_pending_age_seconds,
            "estimated": self.estimated,
            "queues": [
                {"queue": name, **c.as_record(), "paused": self._pause_record(name)}
                for name, c in self.queues.items()
            ],
            "paused": [p.as_record() for p in self.paused.values()],
            "limits": [lim.as_record() for lim in self.limits],
        }

    def _pause_record(self, queue: str) -> dict[str, Any] | None:
        pause = self.paused.get(queue)
        if pause is None:
            return None
        return {"reason": pause.reason, "paused_at": pause.paused_at, "until": pause.until}


@dataclass(frozen=True)
class TableEstimate:
    """What the planner's statistics say about the whole table."""

    rows: int  # live rows now (the statistics counter)
    analyzed: bool  # whether pg_stats has the queue column at all
    queue_shares: dict[str, float] = field(default_factory=dict)  # the most common queues
    other_share: float = 0.0  # the share of each queue not among them
    # The share of all the queues not among them together; None: what the
    # common ones leave.
    rest_share: float | None = None
    changed: int = 0  # rows inserted, updated or deleted since that ANALYZE
    sampled: int = 0  # rows ANALYZE reads at most (0: it read every row)

    def rest(self) -> float:
        if self.rest_share is not None:
            return self.rest_share
        return max(0.0, 1.0 - sum(self.queue_shares.values()))


# How far back a read that wants the newest jobs looks first (newest_first):
# the history's last day or two.
NEWEST_FIRST = 86_400.0
Found = TypeVar("Found")


def newest_first(
    conn: Connection,
    read: Callable[[dt.datetime | None], Found],
    enough: Callable[[Found, dt.datetime], bool],
) -> Found:
    """`read` of the jobs finished in the last NEWEST_FIRST seconds (and of
    every unfinished one), the bound given as a value so that the history's
    days before it are neither planned nor opened; then, unless `enough`
    says that part answers, `read` of every day (None). A new session opens
    each day of the history it plans once, about 0.2 ms a day."""
    newer_than = window_start(conn, NEWEST_FIRST)
    found = read(newer_than)
    if enough(found, newer_than):
        return found
    return read(None)


def stats(conn: Connection, *, exact: bool = False) -> Stats:
    """Counts per status and queue; done is estimated on a long history unless `exact`."""
    queues = counts(conn, done_bound=None if exact else EXACT_DONE_BOUND + 1)
    estimated = not exact and sum(c.done for c in queues.values()) > EXACT_DONE_BOUND
    total_done = None
    if estimated:
        table = table_estimate(conn)
        total_done = estimate_total_done(queues, table)
        for name, n in estimate_done(queues, table).items():
            c = queues.setdefault(name, Counts())
            if n is None:
                c.done_figure = "unknown"  # c.done stays what was seen: a floor
            else:
                c.done, c.done_figure = n, "estimated"
    totals = Counts()
    for c in queues.values():
        totals.add(c)
    if total_done is not None:
        totals.done, totals.done_figure = total_done, "estimated"
    pauses = {p.queue: p for p in paused(conn)}
    for name in pauses:
        queues.setdefault(name, Counts())  # paused before it has any job
    return Stats(totals, dict(sorted(queues.items())), estimated, pauses, flow.limits(conn))


def counts(conn: Connection, *, done_bound: int | None) -> dict[str, Counts]:
    """Exact counts per queue, done among at most `done_bound` jobs (None: all)."""
    if not done_bound:
        return _counts(conn, done_bound, None)
    # The most recent done jobs: all in the newest days when those hold enough.
    return newest_first(
        conn,
        lambda newer_than: _counts(conn, done_bound, newer_than),
        lambda found, _: sum(c.done for c in found.values()) >= done_bound,
    )


def _counts(
    conn: Connection, done_bound: int | None, newer_than: dt.datetime | None
) -> dict[str, Counts]:
    found = {}
    text = query("stats_counts").replace("{done_from}", "jobs" if done_bound == 0 else "all_jobs")
    for row in job_rows(conn, text, {"bound": done_bound, "newer_than": newer_than}):
        found[row["queue"]] = Counts(
            {status: int(row[status]) for status in STATUS_NAMES},
            int(row["expired_leases"]),
            row["oldest_pending_age_seconds"],
            due=int(row["due"]),
        )
    return found


def table_estimate(conn: Connection) -> TableEstimate:
    """Row count, queue shares and their freshness from the statistics;
    reads catalogs only."""
    (row,) = named_rows(conn, "stats_table_estimate")
    rows = int(row["rows"])
    changed = int(row["changed"])
    # ANALYZE reads 300 rows per unit of the column's statistics target.
    sampled = 300 * int(row["target"])
    sampled = 0 if rows <= sampled else sampled
    if row["history_rows"]:
        # Each of the history's days has statistics of its own: the queues'
        # shares of jobs alone would not say how the history splits, so
        # each queue gets the range the counts allow, as before any ANALYZE.
        total = rows + int(row["history_rows"])
        return TableEstimate(total, analyzed=False, changed=changed, sampled=0)
    if not row["analyzed"]:
        return TableEstimate(rows, analyzed=False, changed=changed, sampled=sampled)
    shares = dict(zip(row["common_queues"] or [], row["common_shares"] or [], strict=True))
    # As the planner does for a value outside the most-common list: the rest
    # of the rows spread evenly over the other distinct values.
    n_distinct = row["n_distinct"] if row["n_distinct"] > 0 else -row["n_distinct"] * rows
    others = max(1.0, n_distinct - len(shares))
    rest = max(0.0, 1.0 - row["null_frac"] - sum(shares.values()))
    return TableEstimate(rows, True, shares, rest / others, rest, changed, sampled)


def estimate_total_done(counted: Mapping[str, Counts], table: TableEstimate) -> int:
    """Done jobs in all: the table's live rows less the exact other counts
    (never fewer than the done jobs seen)."""
    seen = sum(c.done for c in counted.values())
    return max(seen, table.rows - sum(c.not_done() for c in counted.values()))


def estimate_done(counted: Mapping[str, Counts], table: TableEstimate) -> dict[str, int | None]:
    """Done jobs per queue, to within a factor of 2, or None where the
    statistics cannot promise that.

    A queue's estimate is its share of the table's rows at the last ANALYZE
    (its most common values) less its exact pending, running and failed
    jobs. How far off that can be is known: since ANALYZE, each row
    inserted, updated or deleted (`changed`) moves a queue's rows by at most
    one; and ANALYZE read a sample, whose shares are off by a few standard
    errors at most. Together with what is certain (a queue has at least the
    done jobs seen in the bounded count, and at most the table's done jobs
    less those seen in other queues), that gives each queue a range; a
    figure within a factor of 2 of all of it exists when the range spans at
    most a factor of 4. A queue outside the common values has only a bound
    from above (all the rows the common ones leave), as has every queue
    before the table was ever analyzed.
    """
    names = set(counted) | set(table.queue_shares)
    seen = {q: counted[q].done if q in counted else 0 for q in names}
    others = {q: counted[q].not_done() if q in counted else 0 for q in names}
    total = estimate_total_done(counted, table)
    all_seen = sum(seen.values())
    found: dict[str, int | None] = {}
    for q in names:
        low, high = seen[q], total - (all_seen - seen[q])
        # Unanalyzed: the done total split as the bounded count saw it.
        guess = total * seen[q] / (all_seen or 1)
        if table.analyzed:
            share = table.queue_shares.get(q)
            common = share is not None
            share = share if share is not None else table.rest()
            spread = table.changed * (1 + share)
            if table.sampled:
                spread += 3 * math.sqrt(share * (1 - share) / table.sampled) * table.rows
            rows = share * table.rows
            high = min(high, math.ceil(rows + spread) - others[q])
            if common:
                low = max(low, math.floor(rows - spread) - others[q])
                guess = rows - others[q]
            else:
                guess = table.other_share * table.rows - others[q]
        high = max(high, low)
        if high > 4 * low:
            found[q] = None
            continue
        # Within a factor of 2 of every count the range allows.
        found[q] = round(min(max(guess, low, high / 2), high, 2 * low))
    return found


# The figures `stats --metric` prints: each status's count, then these.
METRICS: tuple[str, ...] = (*STATUS_NAMES, "expired_leases", "oldest_pending_age_seconds")


def metric_value(stats: Stats, metric: str, queues: Sequence[str] = ()) -> int:
    """One figure as a whole number, of every queue or of `queues` together
    (a count summed, an age the oldest; a queue with no jobs counts 0)."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}")
    scopes = [stats.totals] if not queues else [stats.queues.get(q, Counts()) for q in queues]
    if metric == "oldest_pending_age_seconds":
        ages = [c.oldest_pending_age_seconds or 0.0 for c in scopes]
        return int(max(ages))
    if metric == "expired_leases":
        return sum(c.expired_leases for c in scopes)
    if any(c.as_record()[metric] is None for c in scopes):
        raise PgqctlError(
            f"the {metric} count is not known from the table's statistics: add --exact"
        )
    return sum(c.by_status[metric] for c in scopes)


def notify_workers(conn: Connection) -> None:
    """Tell listening workers there is work; sent when the transaction commits."""
    conn.execute(query("workers_notify"), {})


# --- list and show -----------------------------------------------------------------


# `list` counts the jobs it does not show exactly when only pending, running
# or failed jobs can match (each status through its partial index: the cost
# follows the live jobs), or ids are given; else, as the done history may
# hold millions, at most this many, and says "more than".
LIST_COUNT_BOUND = 10_000
ORDERS = ("newest", "next")


@dataclass(frozen=True)
class JobFilter:
    """Which jobs `list` shows: each filter given narrows, each holds any of its values."""

    statuses: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    ids: tuple[int, ...] = ()
    since: float | None = None  # seconds: created within this long
    error: str | None = None  # last_error holds this text, in any case

    def params(self) -> dict[str, Any]:
        return {
            "statuses": list(self.statuses) or None,
            "queues": list(self.queues) or None,
            "kinds": list(self.kinds) or None,
            "ids": list(self.ids) or None,
            "since": None if self.since is None else dt.timedelta(seconds=self.since),
            "error": self.error,
        }


@dataclass(frozen=True)
class Matched:
    """How many jobs a filter matches: `count` exactly, or more than it when not `exact`."""

    count: int
    exact: bool


def _values(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def list_jobs(
    conn: Connection,
    *,
    status: str | Sequence[str] | None = None,
    queue: str | Sequence[str] | None = None,
    kind: str | Sequence[str] | None = None,
    ids: Sequence[int] = (),
    since: float | None = None,
    error: str | None = None,
    order: str = "newest",
    limit: int | None = 50,
) -> list[Job]:
    """Jobs matching every filter given (each one value or several), newest
    first or, with order "next", pending jobs in claim order; at most
    `limit` (None: all)."""
    found = JobFilter(_values(status), _values(queue), _values(kind), tuple(ids), since, error)
    return select_jobs(conn, found, order=order, limit=limit)


def _list_query(found: JobFilter, order: str) -> str:
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}")
    if order == "next" and set(found.statuses) - {"pending"}:
        raise BadInput(
            "--order next lists pending jobs in the order workers take them: "
            "give no --status, or --status pending"
        )
    return "job_list_next" if order == "next" else "job_list"


def select_jobs(
    conn: Connection,
    found: JobFilter,
    *,
    order: str = "newest",
    limit: int | None = 50,
    before: int | None = None,
    floor: int | None = None,
) -> list[Job]:
    """The jobs `found` matches, in `order`, at most `limit` (None: all);
    newest first, those whose id is below `before` (the next page's) and
    at least `floor`."""
    name = _list_query(found, order)
    if before is not None and order != "newest":
        raise ValueError("pages follow one another newest first only")
    params = {**_window(conn, found), "limit": limit, "before": before, "floor": floor}

    def read(newer_than: dt.datetime | None) -> list[Job]:
        rows = named_rows(conn, name, {**params, "newer_than": newer_than})
        return [Job.from_row(row) for row in rows]

    if order != "newest" or limit is None or found.since is not None:
        return read(None)
    # A full page whose last job was created after the bound is the page of
    # every day: ids are drawn in time, and a job finished before the bound
    # drew its id before it, so it is older than every job on the page.
    return newest_first(
        conn,
        read,
        lambda jobs, newer_than: (
            len(jobs) == limit
            and jobs[-1].created_at is not None
            and jobs[-1].created_at >= newer_than
        ),
    )


def stream_jobs(
    conn: Connection, found: JobFilter, *, order: str = "newest", batch: int = 2000
) -> Iterator[Job]:
    """Every job `found` matches, in `order`, read `batch` at a time through a
    cursor in one read-only transaction, which stays open until the iterator
    is exhausted or closed."""
    name = _list_query(found, order)
    with conn.transaction(), conn.cursor("pgqctl_list", row_factory=dict_row) as cur:
        cur.itersize = batch
        cur.execute(
            with_job_columns(query(name)),
            {**READ_PARAMS, **_window(conn, found), "limit": None, "before": None, "floor": None},
        )
        for row in cur:
            yield Job.from_row(row)


def _window(conn: Connection, found: JobFilter) -> dict[str, Any]:
    """The filter's parameters, with the start of its window on the server's
    clock (`since_at`) when it has one."""
    since_at = None if found.since is None else window_start(conn, found.since)
    return {**found.params(), "since_at": since_at, "newer_than": None}


def count_jobs(conn: Connection, found: JobFilter) -> Matched | None:
    """How many jobs `found` matches: exactly when that is cheap (see
    LIST_COUNT_BOUND), else up to the bound; None (not counted) when done
    jobs may match a test on the error, which no index answers: with fewer
    matches than the bound, the count would read every done job. A window
    of creation times is read through jobs_created_brin, its ranges only."""
    live_only = found.statuses and "done" not in found.statuses
    if not (live_only or found.ids) and found.error:
        return None
    bound = None if live_only or found.ids else LIST_COUNT_BOUND + 1
    params = _window(conn, found)

    def read(newer_than: dt.datetime | None) -> int:
        (row,) = named_rows(conn, "job_count", {**params, "bound": bound, "newer_than": newer_than})
        return int(row["count"])

    if bound is None or found.since is not None:
        count = read(None)
    else:
        # The bound reached within the newest days is reached in all of them.
        count = newest_first(conn, read, lambda n, _: n >= bound)
    if bound is not None and count >= bound:
        return Matched(LIST_COUNT_BOUND, exact=False)
    return Matched(count, exact=True)


def get_job(conn: Connection, job_id: int) -> Job | None:
    """One job, every column; None if there is no such job."""
    found = named_rows(conn, "job_get", {"id": job_id})
    return Job.from_row(found[0]) if found else None


# --- requeue -------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which jobs to requeue: those in `statuses` that every filter given matches."""

    statuses: tuple[str, ...] = ("failed",)
    ids: tuple[int, ...] = ()
    kinds: tuple[str, ...] = ()  # any of these
    queues: tuple[str, ...] = ()  # any of these
    since: float | None = None  # seconds: finished (pending: created) within this long
    error: str | None = None  # last_error holds this text, in any case

    def params(self) -> dict[str, Any]:
        return {
            "statuses": list(self.statuses),
            "ids": list(self.ids) or None,
            "kinds": list(self.kinds) or None,
            "queues": list(self.queues) or None,
            "since": None if self.since is None else dt.timedelta(seconds=self.since),
            "error": self.error,
        }


@dataclass
class Requeued:
    jobs: list[Job]  # as the requeue left them (or, dry, would), in run_at order
    # Each --id that was not requeued, with its status (None: no such job).
    left: dict[int, str | None]
    # Jobs left as they are because a pending or running job holds their
    # unique key: each with the holder's id.
    held: list[tuple[Job, int]] = field(default_factory=list)


def requeue_statement(name: str) -> str:
    """job_requeue or job_requeue_preview, with the pick they share in place."""
    return query(name).replace("{picked}", query("job_requeue_pick"))


def requeue(
    conn: Connection,
    selection: Selection,
    *,
    more: int = 1,
    limit: int | None = None,
    spread: float = 0.0,
    dry_run: bool = False,
) -> Requeued:
    """Requeue the selected jobs in one statement: failed and cancelled ones
    back to pending with `more` new tries, pending ones due now.

    `attempts` is kept (it is the fencing token); a finished job's
    `max_attempts` becomes the tries used + more, a pending job's is kept.
    `last_error` is kept until the next attempt replaces it. At most `limit`
    jobs, oldest finished (pending: soonest due) first; with `spread`
    seconds, their run_at are spread evenly over that window from now, in
    that order. A pending job is never made due later than it was.
    """
    params = {
        **selection.params(),
        "more": more,
        "limit": limit,
        "spread": dt.timedelta(seconds=spread),
    }
    rows: list[dict[str, Any]] = []
    for _ in range(REQUEUE_TRIES):
        changed = _requeue_once(conn, params, dry_run=dry_run)
        rows += [row for row in changed if row["held_by"] != UNSEEN]
        # Jobs that moved into the history while the statement waited for
        # them: a new statement sees them there.
        unseen = [row["id"] for row in changed if row["held_by"] == UNSEEN]
        if not unseen:
            break
        params = {**params, "ids": unseen, "limit": None}
    jobs = sorted(
        (Job.from_row(r) for r in rows if r["held_by"] is None), key=lambda j: (j.run_at, j.id)
    )
    held = [(Job.from_row(r), int(r["held_by"])) for r in rows if r["held_by"] is not None]
    held.sort(key=lambda h: h[0].id)
    moved = {j.id for j in jobs} | {j.id for j, _ in held}
    left = {}
    for job_id in selection.ids:
        if job_id not in moved:
            job = get_job(conn, job_id)
            left[job_id] = job.status if job else None
    return Requeued(jobs, left, held)


# A requeue runs again for the jobs that moved into the history while it
# waited for them, this many times in all. job_requeue gives such a job
# held_by UNSEEN.
REQUEUE_TRIES = 3
UNSEEN = -1


def _requeue_once(
    conn: Connection, params: dict[str, Any], *, dry_run: bool
) -> list[dict[str, Any]]:
    """One requeue statement (or its preview) in its own transaction; its rows."""
    try:
        with conn.transaction():
            if dry_run:
                rows = job_rows(conn, requeue_statement("job_requeue_preview"), params)
                for row in rows:
                    row["status"] = row["requeued_status"]
                    row["run_at"] = row["requeued_run_at"]
                    row["max_attempts"] = row["requeued_max_attempts"]
            else:
                rows = job_rows(conn, requeue_statement("job_requeue"), params)
                if any(row["held_by"] is None for row in rows):
                    notify_workers(conn)
    except psycopg.errors.UniqueViolation as exc:
        if exc.diag.constraint_name != "jobs_unique_key_idx":
            raise
        raise PgqctlError(
            "a job with the unique key of one of these was enqueued meanwhile: nothing "
            "was requeued; run the requeue again"
        ) from None
    return rows


# --- cancel --------------------------------------------------------------------------

# Running jobs named per notification: (id, attempt) pairs stay well under
# PostgreSQL's 8000-byte limit for a payload.
NOTIFY_CANCEL_BATCH = 300
# A cancel that deadlocks with workers reporting on the same jobs (it locks
# many rows) is rolled back as a whole; it tries again this many times.
CANCEL_TRIES = 5


@dataclass(frozen=True)
class CancelSelection:
    """Which jobs to cancel: pending or running ones (those of `statuses`),
    narrowed by each filter given, each holding any of its values."""

    ids: tuple[int, ...] = ()
    queues: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    statuses: tuple[str, ...] = CANCELLABLE

    def params(self) -> dict[str, Any]:
        return {
            "ids": list(self.ids) or None,
            "queues": list(self.queues) or None,
            "kinds": list(self.kinds) or None,
            "statuses": list(self.statuses or CANCELLABLE),
        }


@dataclass(frozen=True)
class CancelledJob:
    """A job as cancel left it (or would leave it): from which status, and
    for a running one whether its worker was already gone (lease expired)."""

    job: Job
    cancelled_from: str
    lease_expired: bool | None

    def as_record(self) -> dict[str, Any]:
        return {
            **self.job.as_record(),
            "cancelled_from": self.cancelled_from,
            "lease_expired": self.lease_expired,
        }


CANCEL_FIELDS = (*FIELDS, "cancelled_from", "lease_expired")


@dataclass
class Cancelled:
    jobs: list[CancelledJob]
    # Each --id that was not cancelled, with its status (None: no such job).
    left: dict[int, str | None]


def cancel_error(reason: str | None) -> str:
    """The last_error of a cancelled job."""
    reason = (reason or "").strip()
    return f"cancelled: {reason}" if reason else "cancelled by an operator"


def cancel(
    conn: Connection,
    selection: CancelSelection,
    *,
    reason: str | None = None,
    dry_run: bool = False,
) -> Cancelled:
    """Cancel the selected pending and running jobs, finished now, with a
    last_error naming `reason`; attempts is kept.

    The workers holding the running ones are told in the same transaction
    (they stop the job when it commits); a worker that cannot hear finds out
    at its next lease renewal. With `dry_run`, the jobs that would be
    cancelled as they would be left, and nothing changed or locked.
    """
    error = cancel_error(reason)
    params = {**selection.params(), "error": error}
    if dry_run:
        rows = named_rows(conn, "job_cancel_select", params)
        jobs = [
            CancelledJob(
                replace(
                    Job.from_row(row),
                    status="cancelled",
                    last_error=error,
                    last_error_cut=False,
                    locked_until=None,
                ),
                row["status"],
                row["lease_expired"],
            )
            for row in rows
        ]
    else:
        jobs = _cancel_retrying(conn, params)
    changed = {c.job.id for c in jobs}
    left = {}
    for job_id in selection.ids:
        if job_id not in changed:
            job = get_job(conn, job_id)
            left[job_id] = job.status if job else None
    return Cancelled(sorted(jobs, key=lambda c: c.job.id), left)


def _cancel_retrying(conn: Connection, params: Mapping[str, Any]) -> list[CancelledJob]:
    for tries_left in range(CANCEL_TRIES - 1, -1, -1):
        try:
            with conn.transaction():
                jobs = [
                    CancelledJob(Job.from_row(row), row["cancelled_from"], row["lease_expired"])
                    for row in named_rows(conn, "job_cancel", params)
                ]
                running = [c.job.held for c in jobs if c.cancelled_from == "running"]
                for start in range(0, len(running), NOTIFY_CANCEL_BATCH):
                    batch = running[start : start + NOTIFY_CANCEL_BATCH]
                    conn.execute(
                        query("workers_notify_cancel"),
                        {"jobs": json.dumps([list(held) for held in batch])},
                    )
            return jobs
        except psycopg.errors.DeadlockDetected:
            if not tries_left:
                raise
    raise AssertionError("unreachable")


# --- purge ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PurgePlan:
    statuses: tuple[str, ...]
    cutoff: dt.datetime  # rows finished before this instant


def purge_plan(conn: Connection, statuses: Sequence[str], older_than: float = 0.0) -> PurgePlan:
    """Fix the cutoff once, on the server's clock, so a purge always ends."""
    (row,) = named_rows(conn, "job_purge_cutoff", {"older_than": dt.timedelta(seconds=older_than)})
    return PurgePlan(tuple(statuses), row["cutoff"])


def purge_count(conn: Connection, plan: PurgePlan) -> int:
    """How many rows the plan matches now."""
    (row,) = named_rows(
        conn, "job_purge_count", {"statuses": list(plan.statuses), "cutoff": plan.cutoff}
    )
    return int(row["count"])


def purge_batch(conn: Connection, plan: PurgePlan, batch_size: int) -> int:
    """Delete up to `batch_size` matching rows in one short transaction: from
    jobs, then from the history's days that are not dropped whole."""
    params = {"statuses": list(plan.statuses), "cutoff": plan.cutoff}
    return batch_across(
        conn, query("job_purge_batch"), ("jobs", "jobs_history"), params, batch_size
    )


def purge(
    conn: Connection,
    plan: PurgePlan,
    *,
    batch_size: int = 10_000,
    on_batch: Callable[[int], None] | None = None,
    pause: float | None = 0.0,
    dropped: list[history.DroppedDay] | None = None,
) -> int:
    """Delete every row the plan matches: the history's days of done jobs
    that end by the cutoff dropped whole (`dropped`), the rest batch by
    batch; the number deleted row by row."""
    days = history.days_before(conn, plan.cutoff) if "done" in plan.statuses else []
    for day in days:
        gone = history.drop_day(conn, day)
        if gone is None:
            continue
        if dropped is not None:
            dropped.append(gone)
        if on_batch and gone.rows:
            on_batch(gone.rows)
    return in_batches(lambda size: purge_batch(conn, plan, size), batch_size, on_batch, pause=pause)


def purge_statuses(choices: Sequence[str]) -> list[str]:
    """The finished statuses `--status` choices name ("all": every finished one)."""
    return sorted({s for c in choices for s in (FINISHED if c == "all" else [c])})
