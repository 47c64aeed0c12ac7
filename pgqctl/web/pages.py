"""What each page shows, read through pgqctl's library in one transaction
per page: plain values for the templates, never HTML (the templates escape
every value they are given).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from pgqctl import admin, attempts, control, doctor, flow, monitor, registry, schedules, why
from pgqctl.db import atomic, window_start
from pgqctl.jobs import Job
from pgqctl.output.limits import limit_cells
from pgqctl.rows import job_rows, named_rows

# The overview's window: the jobs finished and the chart's minutes.
HOUR = 3600.0
# Jobs per page of the jobs list, and the payload characters a job page shows.
PAGE_SIZE = 50
# The ids a page of a search through the history (error text, age) reads
# at most: about 25 ms of a 2-core server's time at any history's size.
SEARCH_SPAN = 200_000
PAYLOAD_SHOWN_CHARS = 20_000


@dataclass(frozen=True)
class QueueRow:
    name: str
    counts: admin.Counts
    done_hour: int
    failed_hour: int
    workers: int
    pause: control.Pause | None


@dataclass(frozen=True)
class Minute:
    at: dt.datetime
    done: int
    failed: int
    wait_p50: float | None  # seconds from due to started, when attempts are kept


@dataclass(frozen=True)
class Overview:
    at: dt.datetime
    queues: list[QueueRow]
    minutes: list[Minute]
    active_workers: int
    stale_workers: int
    # Each flow limit (`pgqctl limit`) as `limit list` says it.
    limits: list[dict[str, Any]] = field(default_factory=list)

    @property
    def peak(self) -> int:
        """The most jobs finished in one minute of the chart (at least 1)."""
        return max([1, *(m.done + m.failed for m in self.minutes)])

    @property
    def wait_peak(self) -> float:
        return max([0.001, *(m.wait_p50 or 0.0 for m in self.minutes)])


def overview(conn: Any) -> Overview:
    """Per queue: its counts, the jobs finished in the last hour, its pause
    and its workers; the last hour minute by minute; the fleet."""
    with atomic(conn):
        figures = monitor.measure(conn, window=HOUR)
        pauses = {p.queue: p for p in control.paused(conn)}
        fleet = registry.list_workers(conn)
        recent = {"since": window_start(conn, HOUR)}
        minutes = [
            Minute(**row)
            for row in job_rows(conn, monitor.with_recent_attempts("web_minutes"), recent)
        ]
        (now,) = named_rows(conn, "web_now", {})
        found_limits = flow.limits(conn)
    names = sorted(set(figures) | set(pauses))
    rows = []
    for name in names:
        f = figures.get(name, monitor.QueueFigures())
        rows.append(
            QueueRow(
                name,
                f.counts,
                f.finished.get("done", 0),
                f.finished.get("failed", 0),
                f.active_workers,
                pauses.get(name),
            )
        )
    active = sum(1 for w in fleet if w.state == "active")
    return Overview(
        now["now"],
        rows,
        _every_minute(minutes, now["now"]),
        active,
        len(fleet) - active,
        [limit_cells(lim) for lim in found_limits],
    )


def _every_minute(found: list[Minute], now: dt.datetime) -> list[Minute]:
    """The last hour's 60 minutes, oldest first, those without jobs as zeros."""
    by_minute = {m.at: m for m in found}
    this_minute = now.replace(second=0, microsecond=0)
    every = []
    for back in range(59, -1, -1):
        at = this_minute - dt.timedelta(minutes=back)
        every.append(by_minute.get(at, Minute(at, 0, 0, None)))
    return every


@dataclass(frozen=True)
class JobsPage:
    jobs: list[Job]
    matched: admin.Matched | None  # None: not counted (it would read the history)
    next_before: int | None  # the id the next page starts below; None: last page
    # The ids a bounded search read (lowest, highest), when it was one.
    searched: tuple[int, int] | None = None


def searches_history(found: admin.JobFilter) -> bool:
    """Whether a page of `found` tests each job it reads (its error text,
    its age) among statuses that include done: no index answers that, and
    a filter that matches few would read the whole history for one page."""
    return (
        (found.error is not None or found.since is not None)
        and (not found.statuses or "done" in found.statuses)
        and not found.ids
    )


def jobs_page(conn: Any, found: admin.JobFilter, before: int | None = None) -> JobsPage:
    """A page of the jobs `found` matches, newest first, below the id
    `before` when given, and how many match in all (bounded where counting
    would read the history). A filter that searches the history reads at
    most SEARCH_SPAN ids a page: a page that found fewer than it shows ends
    where it stopped reading, and the next one reads on from there."""
    with atomic(conn):
        if not searches_history(found):
            page = admin.select_jobs(conn, found, limit=PAGE_SIZE + 1, before=before)
            matched = admin.count_jobs(conn, found)
            more = len(page) > PAGE_SIZE
            page = page[:PAGE_SIZE]
            return JobsPage(page, matched, page[-1].id if more and page else None)
        (ends,) = named_rows(conn, "web_id_range", {})
        lowest, highest = ends["lowest"] or 0, ends["highest"] or 0
        top = min(before, highest + 1) if before is not None else highest + 1
        floor = max(top - SEARCH_SPAN, lowest)
        page = admin.select_jobs(conn, found, limit=PAGE_SIZE + 1, before=top, floor=floor)
    if len(page) > PAGE_SIZE:
        page = page[:PAGE_SIZE]
        return JobsPage(page, None, page[-1].id, (page[-1].id, top - 1))
    return JobsPage(page, None, floor if floor > lowest else None, (floor, top - 1))


@dataclass(frozen=True)
class JobPage:
    job: Job
    payload: str  # pretty JSON, cut to PAYLOAD_SHOWN_CHARS
    payload_cut: bool
    attempts: list[attempts.Attempt]
    why: why.Why | None


def job_page(conn: Any, job_id: int) -> JobPage | None:
    """A job, its attempts and why it is where it is; None if there is none."""
    with atomic(conn):
        job = admin.get_job(conn, job_id)
        if job is None:
            return None
        tried = attempts.list_attempts(conn, job_id)
        found = why.why(conn, job_id)
    payload, cut = _shown_payload(job)
    return JobPage(job, payload, cut, tried, found)


def _shown_payload(job: Job) -> tuple[str, bool]:
    """The payload as the page shows it: its JSON, indented, cut to
    PAYLOAD_SHOWN_CHARS; and whether it was cut (here, or when read)."""
    if job.payload_note is not None:  # its JSON text: cut when read, or too deep to parse
        text = str(job.payload)
    else:
        text = json.dumps(job.payload, indent=2, ensure_ascii=False, default=str)
    cut = job.payload_cut or len(text) > PAYLOAD_SHOWN_CHARS
    return text[:PAYLOAD_SHOWN_CHARS], cut


def attempt_output(conn: Any, job_id: int, attempt: int | None) -> dict[str, Any] | None:
    """One attempt whole, its kept output included."""
    with atomic(conn):
        return attempts.get_attempt(conn, job_id, attempt)


def workers(conn: Any) -> list[registry.Worker]:
    with atomic(conn):
        return registry.list_workers(conn)


def schedule_list(conn: Any) -> list[schedules.Schedule]:
    with atomic(conn):
        return schedules.list_all(conn)


def doctor_report(conn: Any) -> doctor.Report:
    return doctor.diagnose(conn)
