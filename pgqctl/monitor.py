"""What `check` and `metrics` measure, and what `check` holds it to.

Both read per-queue figures of the live jobs (stats' own counts, through the
claim, lease and finished indexes) and of the jobs finished within a short
window (through jobs_finished_idx, that window's range only), so their cost
follows the live jobs, never the history; and the registered workers
(pgqctl/registry.py: a row per worker). Their SQL is
sql/queries/monitor.sql.

`THRESHOLDS` is the one list of what `check` can hold a queue to: each
entry names its option, the figure it reads and the line a breach prints, so
a new threshold is one more entry. Nothing here prints or exits.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgqctl import admin, control, flow, history, registry, schedules
from pgqctl.db import atomic, reason, window_start
from pgqctl.errors import PgqctlError
from pgqctl.jobs import FINISHED, STATUS_NAMES, Job
from pgqctl.leases import Lease
from pgqctl.rows import job_rows, named_rows
from pgqctl.sql import query

Connection = psycopg.Connection[Any]

# `metrics` counts the jobs finished within this long: its throughput figure.
THROUGHPUT_WINDOW_SECONDS = 60.0
# Bucket bounds (seconds) of the run and wait times `metrics` gives.
ATTEMPT_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)


# --- the figures ------------------------------------------------------------------


@dataclass
class QueueFigures:
    """One queue's figures: stats' counts, the running job due longest ago,
    the jobs finished within the window, per finished status, and the
    active workers that serve it."""

    counts: admin.Counts = field(default_factory=admin.Counts)
    oldest_running_age_seconds: float | None = None
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISHED, 0))
    active_workers: int = 0

    def finished_in_window(self) -> int:
        return sum(self.finished.values())


def finished_since(conn: Connection, window: float) -> dict[str, dict[str, int]]:
    """Jobs finished within the last `window` seconds, per queue and finished status."""
    found: dict[str, dict[str, int]] = {}
    with atomic(conn):
        since = window_start(conn, window)
        for status in FINISHED:
            params = {"status": status, "since": since}
            for row in named_rows(conn, "monitor_finished_since", params):
                queue = found.setdefault(row["queue"], dict.fromkeys(FINISHED, 0))
                queue[status] = int(row["finished"])
    return found


def measure(
    conn: Connection, *, window: float | None, queues: Sequence[str] = ()
) -> dict[str, QueueFigures]:
    """Every queue's figures (only `queues`, each present, when given), with
    the jobs finished within `window` seconds (None: not read), in one
    transaction so they describe one instant."""
    with atomic(conn):
        counted = admin.counts(conn, done_bound=0)  # no done rows: check needs none
        running = {
            r["queue"]: r["oldest_running_age_seconds"]
            for r in named_rows(conn, "monitor_running_since", {})
        }
        finished = finished_since(conn, window) if window is not None else {}
        fleet = registry.fleet(conn)
    names = list(dict.fromkeys(queues)) or sorted(set(counted) | set(running) | set(finished))
    figures = {}
    for name in names:
        figures[name] = QueueFigures(
            counted.get(name, admin.Counts()),
            running.get(name),
            finished.get(name, dict.fromkeys(FINISHED, 0)),
            fleet.serving(name),
        )
    return figures


# --- check ------------------------------------------------------------------------


def short_duration(seconds: float) -> str:
    """45s, 12m, 12m05s, 2h, 2h05m, 3d04h: a threshold's own spelling, shortened
    to its two leading units."""
    if seconds < 10 and seconds != int(seconds):
        return f"{seconds:.3g}s"
    s = int(seconds)
    for big, size, small, rest in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "m", 60),
        ("m", 60, "s", 1),
    ):
        if s >= size:
            left = s % size // rest
            return f"{s // size}{big}" + (f"{left:02d}{small}" if left else "")
    return f"{s}s"


def _count(n: float, word: str) -> str:
    return f"{int(n):,} {word}" + ("" if n == 1 else "s")


Value = float | None


@dataclass(frozen=True)
class Threshold:
    """One thing `check` can hold each queue to."""

    name: str  # the option's parameter: max_pending_age for --max-pending-age
    figure: str  # the figure it reads, as JSON names it
    duration: bool  # given as a duration (a unit needed), else a count
    help: str
    read: Callable[[QueueFigures], Value]
    breach: Callable[[float, float], str]  # the line for (value, limit), after the queue
    default: float | None = None  # applied when no threshold is given at all
    minimum: bool = False  # breached below the limit (--min-*), else above it (--max-*)
    # Measures waiting jobs: a paused queue's are meant to wait, so it is
    # held to it only with --include-paused.
    backlog: bool = False

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def spelled(self, limit: float) -> str:
        """A limit as a user gives it: 10m, or 0."""
        return short_duration(limit) if self.duration else f"{int(limit)}"

    def breached(self, value: Value, limit: float) -> bool:
        """A maximum is breached above its limit, a minimum below it."""
        if value is None:
            return False
        return value < limit if self.minimum else value > limit


def _stalled_for(q: QueueFigures) -> Value:
    # How long due jobs have waited with no job of the queue finished in the
    # window: the oldest due job's wait, or 0 once one finished.
    if q.finished_in_window():
        return 0.0
    return q.counts.oldest_pending_age_seconds or 0.0


def _d(seconds: float) -> str:
    return short_duration(seconds)


THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "max_pending_age",
        "oldest_pending_age_seconds",
        duration=True,
        help="Oldest due pending job waited longer than this, e.g. 5m.",
        read=lambda q: q.counts.oldest_pending_age_seconds,
        breach=lambda v, m: f"oldest pending job waited {_d(v)} (max {_d(m)})",
        backlog=True,
    ),
    Threshold(
        "max_pending",
        "pending",
        duration=False,
        help="More pending jobs than this (due or not).",
        read=lambda q: q.counts.by_status["pending"],
        breach=lambda v, m: f"{_count(v, 'pending job')} (max {int(m):,})",
        backlog=True,
    ),
    Threshold(
        "max_failed",
        "failed",
        duration=False,
        help="More failed jobs than this, of any age: a failed job counts until "
        "it is requeued or purged (0: none tolerated).",
        read=lambda q: q.counts.by_status["failed"],
        breach=lambda v, m: f"{_count(v, 'failed job')} (max {int(m):,})",
    ),
    Threshold(
        "max_expired_leases",
        "expired_leases",
        duration=False,
        help="More expired leases than this (jobs whose worker is gone, not yet reaped).",
        read=lambda q: q.counts.expired_leases,
        breach=lambda v, m: f"{_count(v, 'expired lease')} (max {int(m):,})",
        default=0,
    ),
    Threshold(
        "max_running_age",
        "oldest_running_age_seconds",
        duration=True,
        help="A job running longer than this since its claim, e.g. 1h.",
        read=lambda q: q.oldest_running_age_seconds,
        breach=lambda v, m: f"oldest running job has run {_d(v)} (max {_d(m)})",
    ),
    Threshold(
        "stalled",
        "stalled_seconds",
        duration=True,
        help="Due jobs waited longer than this and no job of the queue finished within it.",
        read=_stalled_for,
        breach=lambda v, m: (
            f"stalled: due jobs waited {_d(v)} and no job finished in {_d(m)} "
            f"(stalled after {_d(m)})"
        ),
        default=600,
        backlog=True,
    ),
    Threshold(
        "min_workers",
        "active_workers",
        duration=False,
        help="Fewer active workers than this serve the queue (`pgqctl workers`; "
        "one with no --queue serves every queue).",
        read=lambda q: q.active_workers,
        breach=lambda v, m: f"{_count(v, 'active worker')} serving it (min {int(m):,})",
        minimum=True,
    ),
)
BY_NAME = {t.name: t for t in THRESHOLDS}
# The one threshold whose window `measure` reads finished jobs for.
STALL = BY_NAME["stalled"]


def applied(given: Mapping[str, float | None]) -> dict[str, float]:
    """The thresholds `check` applies: those given, or the defaults when none is."""
    chosen = {name: limit for name, limit in given.items() if limit is not None}
    unknown = set(chosen) - set(BY_NAME)
    if unknown:
        raise ValueError(f"unknown thresholds {sorted(unknown)}")
    if chosen:
        return chosen
    return {t.name: t.default for t in THRESHOLDS if t.default is not None}


@dataclass(frozen=True)
class Figure:
    """A measured figure and the threshold it is held to (None: none applied)."""

    threshold: Threshold
    value: Value
    limit: float | None

    @property
    def ok(self) -> bool:
        return self.limit is None or not self.threshold.breached(self.value, self.limit)

    def as_record(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "threshold": self.limit,
            "option": self.threshold.option,
            "ok": self.ok,
        }


@dataclass(frozen=True)
class QueueCheck:
    queue: str
    figures: tuple[Figure, ...]
    finished_in_window: int | None  # within --stalled, when applied
    pause: control.Pause | None = None  # paused now

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.figures)

    def breaches(self) -> Iterator[str]:
        paused = " (paused)" if self.pause else ""
        for f in self.figures:
            if not f.ok:
                assert f.value is not None and f.limit is not None
                yield f"CRITICAL {self.queue}{paused}: {f.threshold.breach(f.value, f.limit)}"


@dataclass(frozen=True)
class ScheduleCheck:
    """A schedule held to its ticks: missed when a tick was not enqueued
    within schedules.MISSED_GRACE of its time (a paused one never is)."""

    name: str
    missed_since: dt.datetime | None
    last_tick: dt.datetime | None

    @property
    def ok(self) -> bool:
        return self.missed_since is None

    def breach(self) -> str:
        from pgqctl.payload import iso_utc

        assert self.missed_since is not None
        last = (
            "no tick enqueued yet"
            if self.last_tick is None
            else (f"last tick enqueued {iso_utc(self.last_tick)}")
        )
        return (
            f"CRITICAL schedule {self.name}: tick {iso_utc(self.missed_since)} missed "
            f"(not enqueued within {schedules.MISSED_GRACE:g}s; {last}): is any worker running?"
        )

    def as_record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "missed_since": self.missed_since,
            "last_tick": self.last_tick,
        }


@dataclass(frozen=True)
class LimitCheck:
    """A limit held to --max-held-back-age: breached when the oldest due job
    it holds back has waited longer."""

    limit: flow.Limit
    max_age: float

    @property
    def ok(self) -> bool:
        return not self.limit.held_back or (self.limit.held_back_seconds or 0.0) <= self.max_age

    def breach(self) -> str:
        lim = self.limit
        return (
            f"CRITICAL limit {lim.scope} {lim.name}: {_count(lim.held_back, 'due job')} held back "
            f"({lim.rule()}), the oldest for {_d(lim.held_back_seconds or 0.0)} "
            f"(max {_d(self.max_age)})"
        )

    def as_record(self) -> dict[str, Any]:
        return {**self.limit.as_record(), "ok": self.ok, "max_held_back_seconds": self.max_age}


@dataclass(frozen=True)
class HistoryCheck:
    """How long the oldest finished job has stayed in jobs, not moved into
    the history, against the most allowed (--max-unmoved-age)."""

    unmoved_for: float | None  # None: every finished job moved
    limit: float

    @property
    def ok(self) -> bool:
        return self.unmoved_for is None or self.unmoved_for <= self.limit

    def breach(self) -> str:
        return (
            f"history: a finished job has stayed in jobs for {_d(self.unmoved_for or 0)} "
            f"(max {_d(self.limit)}): no worker has moved it into the history (they run "
            "with --no-archive or a longer --archive-after, none runs, or they fall behind)"
        )

    def as_record(self) -> dict[str, Any]:
        return {"ok": self.ok, "unmoved_seconds": self.unmoved_for, "max_unmoved_age": self.limit}


@dataclass(frozen=True)
class CheckResult:
    queues: tuple[QueueCheck, ...]
    thresholds: dict[str, float]
    ts: dt.datetime
    schedules: tuple[ScheduleCheck, ...] | None = None  # None: not checked
    limits: tuple[LimitCheck, ...] | None = None  # None: not checked
    history: HistoryCheck | None = None  # None: not checked

    @property
    def ok(self) -> bool:
        return (
            all(q.ok for q in self.queues)
            and all(s.ok for s in self.schedules or ())
            and all(lim.ok for lim in self.limits or ())
            and (self.history is None or self.history.ok)
        )

    def breaches(self) -> list[str]:
        """One line per threshold a queue breaches, queue by queue, then one
        per schedule with a missed tick, then one per limit holding jobs
        back too long."""
        lines = [line for q in self.queues for line in q.breaches()]
        lines += [s.breach() for s in self.schedules or () if not s.ok]
        lines += [lim.breach() for lim in self.limits or () if not lim.ok]
        if self.history is not None and not self.history.ok:
            lines.append(self.history.breach())
        return lines

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "ts": self.ts,
            "thresholds": self.thresholds,
            "queues": [
                {
                    "queue": q.queue,
                    "ok": q.ok,
                    "paused": q.pause is not None,
                    "paused_until": None if q.pause is None else q.pause.until,
                    "figures": {f.threshold.figure: f.as_record() for f in q.figures},
                    "finished_in_window": q.finished_in_window,
                }
                for q in self.queues
            ],
            **(
                {}
                if self.schedules is None
                else {"schedules": [s.as_record() for s in self.schedules]}
            ),
            **({} if self.limits is None else {"limits": [lim.as_record() for lim in self.limits]}),
            **({} if self.history is None else {"history": self.history.as_record()}),
            "breaches": self.breaches(),
        }


def check(
    conn: Connection,
    thresholds: Mapping[str, float],
    queues: Sequence[str] = (),
    *,
    with_schedules: bool = False,
    include_paused: bool = False,
    max_held_back_age: float | None = None,
    max_unmoved_age: float | None = None,
) -> CheckResult:
    """Hold each queue (only `queues`, when given) to `thresholds` (by
    Threshold name, as `applied` returns them), and with `with_schedules`
    each schedule to its ticks. A paused queue is held to its backlog
    thresholds only with `include_paused`: its jobs wait because they were
    told to. With `max_held_back_age`, each limit is held to how long the
    oldest due job it holds back has waited. With `max_unmoved_age`, the
    history is held to how long a finished job has stayed in jobs."""
    window = thresholds.get(STALL.name)
    measured = measure(conn, window=window, queues=queues)
    pauses = {p.queue: p for p in control.paused(conn)}
    checked = []
    for name, q in measured.items():
        pause = pauses.get(name)
        figures = tuple(
            # The stall figure needs the window's finished jobs, read only with one.
            Figure(
                t,
                None if t is STALL and window is None else t.read(q),
                None if pause and t.backlog and not include_paused else thresholds.get(t.name),
            )
            for t in THRESHOLDS
        )
        finished = None if window is None else q.finished_in_window()
        checked.append(QueueCheck(name, figures, finished, pause))
    held = None
    if with_schedules:
        held = tuple(
            ScheduleCheck(s.name, s.missed_since, s.last_tick) for s in schedules.list_all(conn)
        )
    limited = None
    if max_held_back_age is not None:
        limited = tuple(LimitCheck(lim, max_held_back_age) for lim in flow.limits(conn))
    return CheckResult(
        tuple(checked),
        dict(thresholds),
        dt.datetime.now(dt.timezone.utc),
        held,
        limited,
        None
        if max_unmoved_age is None
        else HistoryCheck(history.state(conn).unmoved_for(), max_unmoved_age),
    )


# --- metrics ----------------------------------------------------------------------


@dataclass
class Spread:
    """How many attempts fell below each of ATTEMPT_BUCKETS (cumulative: the
    n-th holds those under the n-th bound), how many in all, and their sum."""

    below: list[int] = field(default_factory=lambda: [0] * len(ATTEMPT_BUCKETS))
    count: int = 0
    seconds: float = 0.0

    def add(self, bucket: int, attempts: int, seconds: float) -> None:
        """`attempts` in width_bucket's `bucket` (0: under the first bound)."""
        for i in range(bucket, len(ATTEMPT_BUCKETS)):
            self.below[i] += attempts
        self.count += attempts
        self.seconds += seconds


@dataclass
class AttemptFigures:
    """One queue and kind's attempts of the last window: how long they ran,
    how long they waited to start, and how each ended."""

    ran: Spread = field(default_factory=Spread)
    waited: Spread = field(default_factory=Spread)
    outcomes: dict[str, int] = field(default_factory=dict)


def with_recent_attempts(name: str) -> str:
    """A named statement with the attempts of its window in place of
    {recent_attempts} (monitor_recent_attempts)."""
    return query(name).replace("{recent_attempts}", query("monitor_recent_attempts"))


def attempt_figures(conn: Connection, window: float) -> dict[tuple[str, str], AttemptFigures]:
    """The attempts that finished within the last `window` seconds, per (queue, kind)."""
    found: dict[tuple[str, str], AttemptFigures] = {}
    with atomic(conn):
        params = {"since": window_start(conn, window), "bounds": list(ATTEMPT_BUCKETS)}
        for row in job_rows(conn, with_recent_attempts("monitor_attempt_times"), params):
            figures = found.setdefault((row["queue"], row["kind"]), AttemptFigures())
            spread = figures.ran if row["measure"] == "ran" else figures.waited
            spread.add(int(row["bucket"]), int(row["attempts"]), float(row["seconds"] or 0.0))
        for row in job_rows(conn, with_recent_attempts("monitor_attempt_outcomes"), params):
            figures = found.setdefault((row["queue"], row["kind"]), AttemptFigures())
            figures.outcomes[row["outcome"]] = int(row["attempts"])
    return found


@dataclass(frozen=True)
class MetricsSnapshot:
    """What `metrics` exposes: stats' counts per queue, and the jobs finished
    in the last minute."""

    counts: dict[str, admin.Counts]
    finished: dict[str, dict[str, int]]  # queue -> finished status -> jobs
    paused: frozenset[str] = frozenset()  # queues paused now
    fleet: registry.Fleet = field(default_factory=lambda: registry.Fleet(0, 0, ()))
    # (queue, kind) -> the attempts that finished in the last minute
    attempts: dict[tuple[str, str], AttemptFigures] = field(default_factory=dict)
    limits: list[flow.Limit] = field(default_factory=list)

    def queues(self) -> list[str]:
        return sorted(set(self.counts) | set(self.finished) | self.paused)


def metrics_snapshot(conn: Connection, *, exact: bool = False) -> MetricsSnapshot:
    """Read everything `metrics` exposes, in one transaction.

    Done jobs are the history: unless `exact` (which counts them all, as
    `stats --exact`), they are not read, and their count is left out rather
    than estimated, so that a scrape costs what the live jobs cost (an
    estimate reads the planner's statistics, which costs as much again).
    """
    with atomic(conn):
        counts = admin.stats(conn, exact=True).queues if exact else admin.counts(conn, done_bound=0)
        finished = finished_since(conn, THROUGHPUT_WINDOW_SECONDS)
        pauses = frozenset(p.queue for p in control.paused(conn))
        fleet = registry.fleet(conn)
        attempts = attempt_figures(conn, THROUGHPUT_WINDOW_SECONDS)
        found_limits = flow.limits(conn)
    for name in finished:
        counts.setdefault(name, admin.Counts())  # a queue with no live jobs
    if not exact:
        for c in counts.values():
            c.done_figure = "unknown"  # not counted: by_status holds 0
    return MetricsSnapshot(counts, finished, pauses, fleet, attempts, found_limits)


def metric_families(snapshot: MetricsSnapshot) -> Iterable[Any]:
    """The snapshot as Prometheus metric families (prometheus_client's own
    types, for its exposition to write)."""
    from prometheus_client.core import GaugeMetricFamily

    jobs = GaugeMetricFamily(
        "pgqctl_jobs",
        "Jobs per queue and status, exactly (done only with --exact: it is the history).",
        labels=["queue", "status"],
    )
    age = GaugeMetricFamily(
        "pgqctl_oldest_pending_age_seconds",
        "Seconds the oldest due pending job of the queue has waited (0: none waits).",
        labels=["queue"],
    )
    expired = GaugeMetricFamily(
        "pgqctl_expired_leases",
        "Running jobs whose lease is over (their worker is gone), not yet reaped.",
        labels=["queue"],
    )
    finished = GaugeMetricFamily(
        "pgqctl_jobs_finished_last_minute",
        "Jobs of the queue that finished in the last 60 seconds, by outcome (throughput).",
        labels=["queue", "outcome"],
    )
    paused = GaugeMetricFamily(
        "pgqctl_queue_paused",
        "1 while the queue is paused (pgqctl pause): workers claim none of its jobs.",
        labels=["queue"],
    )
    fleet = GaugeMetricFamily(
        "pgqctl_workers",
        "Registered workers by state: active (heartbeating), stale (no heartbeat "
        "for three intervals: killed or cut off).",
        labels=["state"],
    )
    for state, count in snapshot.fleet.counts().items():
        fleet.add_metric([state], count)
    serving = GaugeMetricFamily(
        "pgqctl_queue_workers",
        "Active workers that serve the queue (one with no --queue serves every queue).",
        labels=["queue"],
    )
    for name in snapshot.queues():
        counts = snapshot.counts.get(name, admin.Counts())
        record = counts.as_record()
        for status in STATUS_NAMES:
            if record[status] is not None:
                jobs.add_metric([name, status], record[status])
        age.add_metric([name], counts.oldest_pending_age_seconds or 0.0)
        expired.add_metric([name], counts.expired_leases)
        done = snapshot.finished.get(name, {})
        for status in FINISHED:
            finished.add_metric([name, status], done.get(status, 0))
        paused.add_metric([name], 1.0 if name in snapshot.paused else 0.0)
        serving.add_metric([name], snapshot.fleet.serving(name))
    return (
        jobs,
        age,
        expired,
        finished,
        paused,
        fleet,
        serving,
        *attempt_families(snapshot),
        *limit_families(snapshot),
    )


def limit_families(snapshot: MetricsSnapshot) -> tuple[Any, ...]:
    """Each limit (`pgqctl limit`): the jobs running under it, what it allows
    at once, and the due jobs it holds back now with the oldest one's wait."""
    from prometheus_client.core import GaugeMetricFamily

    labels = ["scope", "name"]
    running = GaugeMetricFamily(
        "pgqctl_limit_running", "Jobs of the limit's queue or kind running now.", labels=labels
    )
    allowed = GaugeMetricFamily(
        "pgqctl_limit_concurrency",
        "The limit's concurrency: at most this many of its jobs run at once.",
        labels=labels,
    )
    held = GaugeMetricFamily(
        "pgqctl_limit_held_back",
        "Due jobs the limit holds back now (full, out of tokens, or of full keys).",
        labels=labels,
    )
    held_age = GaugeMetricFamily(
        "pgqctl_limit_held_back_seconds",
        "Seconds the oldest due job the limit holds back has waited (0: none).",
        labels=labels,
    )
    for limit in snapshot.limits:
        names = [limit.scope, limit.name]
        running.add_metric(names, limit.running)
        if limit.concurrency is not None:
            allowed.add_metric(names, limit.concurrency)
        held.add_metric(names, limit.held_back)
        held_age.add_metric(
            names, max(limit.held_back_seconds or 0.0, 0.0) if limit.held_back else 0.0
        )
    return (running, allowed, held, held_age)


def attempt_families(snapshot: MetricsSnapshot) -> tuple[Any, ...]:
    """The last minute's attempts: run and wait times as gauge histograms (a
    histogram of a window, not a running total: histogram_quantile applies
    to it without rate()), and the attempts by outcome."""
    from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily

    ran = GaugeHistogramMetricFamily(
        "pgqctl_attempt_run_seconds",
        "Attempts that finished in the last 60 seconds, by how long they ran (started to "
        "finished; le: under that many seconds).",
        labels=["queue", "kind"],
    )
    waited = GaugeHistogramMetricFamily(
        "pgqctl_attempt_wait_seconds",
        "Attempts that finished in the last 60 seconds, by how long they waited to start "
        "(due to started; le: under that many seconds).",
        labels=["queue", "kind"],
    )
    outcomes = GaugeMetricFamily(
        "pgqctl_attempts_last_minute",
        "Attempts that finished in the last 60 seconds, by how they ended (done, failed, "
        "timed_out, cancelled, lease_lost, handed_back, refused).",
        labels=["queue", "kind", "outcome"],
    )
    for (queue, kind), figures in sorted(snapshot.attempts.items()):
        for family, spread in ((ran, figures.ran), (waited, figures.waited)):
            if spread.count:
                buckets = [(repr(b), n) for b, n in zip(ATTEMPT_BUCKETS, spread.below, strict=True)]
                family.add_metric([queue, kind], [*buckets, ("+Inf", spread.count)], spread.seconds)
        for outcome, count in sorted(figures.outcomes.items()):
            outcomes.add_metric([queue, kind, outcome], count)
    return (ran, waited, outcomes)


class _Families:
    """A collector (prometheus_client's protocol) yielding fixed families."""

    def __init__(self, families: Iterable[Any]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Any]:
        yield from self._families


def metrics_registry(snapshot: MetricsSnapshot) -> Any:
    """A registry of its own (never the process-wide one) holding the snapshot."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(metric_families(snapshot)))  # type: ignore[arg-type]
    return registry


# --- serving metrics over HTTP ----------------------------------------------------


def metrics_server(
    host: str,
    port: int,
    read: Callable[[], bytes],
    on_error: Callable[[str], None],
) -> Any:
    """An HTTP server (not yet serving) answering GET /metrics with `read()`,
    called afresh for each scrape. When the database cannot be read, the
    scrape gets 503 with the reason in one line (and `on_error` hears it);
    the server goes on serving."""
    # Imported here: only `metrics --listen` needs them.
    import socket
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import CONTENT_TYPE_LATEST

    TEXT = "text/plain; charset=utf-8"

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """No line per scrape: a failed one is told through `on_error`."""

    class Server6(WSGIServer):
        address_family = socket.AF_INET6

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", TEXT)])
            return [b"not found: metrics are at /metrics\n"]
        try:
            body = read()
        except (PgqctlError, psycopg.Error) as exc:
            why = str(exc) if isinstance(exc, PgqctlError) else f"database error: {reason(exc)}"
            why = " ".join(why.split())  # one line
            on_error(why)
            start_response("503 Service Unavailable", [("Content-Type", TEXT)])
            return [f"{why}\n".encode()]
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
        return [body]

    server_class = Server6 if ":" in host else WSGIServer
    return make_server(host, port, app, server_class=server_class, handler_class=QuietHandler)


# --- top ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TopView:
    """One frame of `top`: each queue's counts, pause and finishing rates, the
    leases ending soonest and the workers."""

    ts: dt.datetime
    window: float  # the seconds the rates are measured over
    counts: dict[str, admin.Counts]
    finished: dict[str, dict[str, int]]  # queue -> finished status -> jobs in the window
    paused: dict[str, control.Pause]
    leases: list[Lease]
    workers: list[registry.Worker]  # the registry: active and stale ones
    # Per kind, the last minute's attempts: (kind, attempts, (p50, p95, p99) run seconds)
    run_times: list[tuple[str, int, tuple[float, float, float]]] = field(default_factory=list)
    # The flow limits (`pgqctl limit`), each with what runs and waits under it.
    limits: list[flow.Limit] = field(default_factory=list)
    # Queues an earlier frame showed: a drained queue stays on the screen at
    # pending 0 rather than vanish the moment its last job finishes.
    shown_before: frozenset[str] = frozenset()

    def queues(self) -> list[str]:
        return sorted(set(self.counts) | set(self.finished) | set(self.paused) | self.shown_before)

    def rate(self, queue: str, status: str) -> float:
        """Jobs of `queue` that reached `status` per second over the window."""
        return self.finished.get(queue, {}).get(status, 0) / self.window


def top_view(
    conn: Connection, *, window: float, leases: int = 10, shown_before: Iterable[str] = ()
) -> TopView:
    """A frame of `top`, in one transaction; the rates count the jobs that
    finished within the last `window` seconds (the time since the previous
    frame); the queues `shown_before` keep their rows. Every read is bounded
    by the live jobs and that window's finished ones, as `metrics`' are,
    never by the history."""
    with atomic(conn):
        counts = admin.counts(conn, done_bound=0)
        finished = finished_since(conn, window)
        pauses = {p.queue: p for p in control.paused(conn)}
        soonest = [
            Lease(
                Job.from_row(r),
                r["expired"],
                None if r["seconds_left"] is None else float(r["seconds_left"]),
            )
            for r in named_rows(conn, "monitor_leases_soonest", {"limit": leases})
        ]
        fleet = registry.list_workers(conn)
        params = {"since": window_start(conn, THROUGHPUT_WINDOW_SECONDS)}
        run_times = [
            (r["kind"], int(r["attempts"]), _three(r["percentiles"]))
            for r in job_rows(conn, with_recent_attempts("monitor_kind_run_times"), params)
        ]
        found_limits = flow.limits(conn)
    return TopView(
        dt.datetime.now(dt.timezone.utc),
        window,
        counts,
        finished,
        pauses,
        soonest,
        fleet,
        run_times,
        found_limits,
        frozenset(shown_before),
    )


def _three(values: list[float]) -> tuple[float, float, float]:
    p50, p95, p99 = (float(v) for v in values)
    return p50, p95, p99
