"""Listings laid out for a terminal's width: rendered to fixed-width consoles."""

from __future__ import annotations

import datetime as dt
import io
import re
from typing import Any

import pytest

from pgqctl import admin, leases, registry
from pgqctl.commands.admin import CHANGE_COLUMNS, LEASE_COLUMNS, LIST_COLUMNS, REQUEUE_COLUMNS
from pgqctl.jobs import Job
from pgqctl.output.fitting import fit
from pgqctl.output.formats import emit_rows
from pgqctl.output.jobs import _job_cells
from pgqctl.output.schedules import SCHEDULE_COLUMNS, _schedule_cells
from pgqctl.output.stats import STATS_COLUMNS, _stats_rows
from pgqctl.output.top import share_rows
from pgqctl.output.workers import WORKER_COLUMNS, _worker_cells
from pgqctl.runner import Outcome
from pgqctl.text import error_summary, human, id_ranges

WHEN = dt.datetime(2026, 12, 1, 14, 21, 4, 382000, tzinfo=dt.timezone.utc)
HOLDER = "ip-10-0-12-34.eu-west-1.compute.internal:48213:3"
ERROR = (
    "exit status 1\nTraceback (most recent call last):\n  ...\n"
    "ValueError: /srv/uploads/2026/12/01/a-very-long-file-name.png is not a PNG file"
)
# A time as each style shows it: never cut.
TIME = re.compile(r"2026-12-01 14:21:04\+00:00|12-01 14:21:04Z|12-01 14:21Z")
ANY_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d\d:\d\d|\d\d-\d\d \d\d:\d\d(:\d\d)?Z")


def jobs() -> list[Job]:
    kinds = ["nopayload", "send_receipt", "resize_image_thumbnails_for_the_gallery"]
    return [
        Job(
            434_011 - i,
            ["default", "emails", "a-queue-with-a-rather-long-name"][i % 3],
            kinds[i % 3],
            {},
            status=["failed", "pending", "done"][i % 3],
            attempts=3,
            max_attempts=3,
            run_at=WHEN,
            finished_at=None if i % 3 == 1 else WHEN,
            last_error=ERROR if i % 3 == 0 else None,
            # A long key: a listing does not show it (show and --json do).
            unique_key=f"webhook:customer-{i}:invoice-2026-12-01-a-rather-long-reference",
            # Some jobs of a schedule: `list` shows which, and the tick.
            schedule="nightly-report" if i % 2 else None,
            tick=WHEN if i % 2 else None,
        )
        for i in range(6)
    ]


def listings() -> dict[str, tuple[list[dict[str, Any]], list[str]]]:
    held = [leases.Lease(replace_status(j, "running", HOLDER), True, -312.5) for j in jobs()]
    reaped = [
        leases.Reaped(
            replace_status(
                j,
                "pending",
                HOLDER,
                f"lease expired at 2026-11-30T14:21:04.382Z (held by {HOLDER})",
            ),
            HOLDER,
        )
        for j in jobs()
    ]
    stats = admin.Stats(
        admin.Counts.of(pending=434_011, done=48_210_334, failed=3),
        {
            "default": admin.Counts.of(pending=434_000, done=48_210_000, failed=3),
            "a-queue-with-a-name-far-too-long-for-any-column-really": admin.Counts.of(
                pending=11, done=334
            ),
        },
        estimated=True,
    )
    fleet = [
        registry.Worker(
            id=f"{HOLDER.rpartition(':')[0]}{i}",
            state=["active", "stale"][i % 2],
            host=HOLDER.split(":")[0],
            pid=4_194_000 + i,
            version="0.1.0",
            queues=(("emails", "a-queue-with-a-rather-long-name"), ())[i % 2],
            kinds=(("resize_image_thumbnails_for_the_gallery",), ())[i % 2],
            concurrency=64,
            running=64,
            done=48_210_334,
            failed=12_345,
            started_at=WHEN,
            last_seen=WHEN,
            seen_seconds_ago=12_345.6,
            heartbeat_seconds=10.0,
            lease_seconds=300.0,
            jobs=tuple(range(434_011, 434_075)),
            prefetched=tuple(range(434_075, 434_079)),
        )
        for i in range(4)
    ]
    return {
        "workers": (
            [_worker_cells(w.as_record()) for w in fleet],
            WORKER_COLUMNS,
        ),
        "list": ([_job_cells(j.as_record()) for j in jobs()], LIST_COLUMNS),
        "leases": ([_job_cells(r.as_record()) for r in held], LEASE_COLUMNS),
        "reap": ([_job_cells(r.as_record()) for r in reaped], CHANGE_COLUMNS),
        "requeue": (
            [_job_cells(replace_status(j, "pending", HOLDER).as_record()) for j in jobs()],
            REQUEUE_COLUMNS,
        ),
        "stats": (_stats_rows(stats), STATS_COLUMNS),
    }


def replace_status(job: Job, status: str, holder: str, error: str | None = None) -> Job:
    import dataclasses

    return dataclasses.replace(
        job, status=status, locked_by=holder, locked_until=WHEN, last_error=error
    )


def table_cells(lines: list[str]) -> list[dict[str, str]]:
    """The rows of a rendered table, each by column name, cut out by the
    spans of its rule line (rich's ━━╇━━ or tabulate's ---  ---)."""
    rule = lines[1].replace("╇", " ")
    spans = [m.span() for m in re.finditer(r"[^ ]+", rule)]
    names = [lines[0][a:b].replace("┃", "").strip() for a, b in spans]
    return [
        {
            name: line[a:b].replace("│", "").strip()
            for name, (a, b) in zip(names, spans, strict=True)
        }
        for line in lines[2:]
        if line.strip()
    ]


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("fmt", ["table", "plain"])
@pytest.mark.parametrize("name", ["list", "leases", "reap", "requeue", "stats", "workers"])
def test_a_listing_fits_the_width_and_breaks_no_value(width: int, fmt: str, name: str) -> None:
    rows, columns = listings()[name]
    out = io.StringIO()
    emit_rows(rows, columns, fmt, stream=out, width=width)
    lines = out.getvalue().splitlines()
    assert all(len(line) <= width for line in lines), [len(line) for line in lines]
    header = lines[0].replace("┃", " ").split()
    assert set(header) <= set(columns) and header[0] == columns[0]  # every header whole
    shown = table_cells(lines)
    assert len(shown) == len(rows)  # one line per row: nothing wrapped
    for row, cells in zip(rows, shown, strict=True):
        for column, cell in cells.items():
            value = row[column]
            if column == "id" or (name == "stats" and column != "queue"):
                assert cell == str(value)  # never cut
            elif column in ("run_at", "finished_at", "locked_until", "started_at"):
                assert cell == "" if value is None else TIME.fullmatch(cell), cell
            elif column in ("status", "attempt", "locked_by", "left", "pid", "state", "running"):
                assert cell == human(value)
            else:  # text: whole, or cut with …
                text = human(value)
                assert cell == text or (cell.endswith("…") and text.startswith(cell[:-1]))


def test_the_error_is_cut_first_and_times_shortened_before_columns_go() -> None:
    rows, columns = listings()["list"]
    # Jobs of no schedule: that column is empty, and left out first.
    rows = [{**r, "schedule": ""} for r in rows]
    columns = [c for c in columns if c != "schedule"]
    wide = fit(rows, columns, 200)
    assert wide.columns == list(columns) and wide.style == "full"
    at_120 = fit(rows, columns, 120)
    assert at_120.columns == list(columns) and at_120.style in ("utc", "short")
    widths = dict(zip(at_120.columns, at_120.widths, strict=True))
    assert widths["error"] < wide.widths[-1]
    at_80 = fit(rows, columns, 80)
    assert {"id", "status", "attempt", "error"} <= set(at_80.columns)
    assert "finished_at" not in at_80.columns  # the least important goes first


def test_an_empty_column_is_left_out_before_a_full_one() -> None:
    rows, columns = listings()["list"]
    pending = [r for r in rows if r["status"] == "pending"]
    layout = fit(pending, columns, 80)
    assert "finished_at" not in layout.columns  # empty: left out before run_at
    assert "run_at" in layout.columns


def test_the_error_column_reads_the_worker_s_last_error() -> None:
    tail = "converting\nconvert: no such file a.png\n"
    failed = Outcome(exit_code=1, output_tail=tail).last_error()
    assert error_summary(failed) == "exit status 1: convert: no such file a.png"
    long = Outcome(exit_code=2, output_tail="x" * 5000 + "\nlast\n", output_bytes=9000)
    assert error_summary(long.last_error(limit=100)) == "exit status 2: last"
    timed_out = Outcome(timed_out=True, timeout=1.0, output_tail="slow\n").last_error()
    assert error_summary(timed_out) == "timed out after 1s: slow"
    assert error_summary(Outcome(exit_code=1).last_error()) == "exit status 1"
    assert error_summary("boom\nTraceback...") == "boom"
    assert error_summary(None) == ""


def test_the_schedule_of_a_job_stays_before_when_it_finished() -> None:
    rows, columns = listings()["list"]
    at_120 = fit(rows, columns, 120)
    assert "schedule" in at_120.columns and "finished_at" not in at_120.columns
    cells = at_120.cells(rows)
    shown = [row[at_120.columns.index("schedule")] for row in cells]
    assert shown[1].startswith("nightly-") and shown[0] == ""


def schedule_records() -> list[dict[str, Any]]:
    base = {
        "cron": "*/15 9-17 * * MON-FRI",
        "every_seconds": None,
        "timezone": "America/Argentina/Buenos_Aires",
        "kind": "k",
        "payload": {},
        "queue": "default",
        "priority": 0,
        "max_attempts": 3,
        "source": "file",
        "created_at": WHEN,
        "updated_at": WHEN,
        "next_tick": WHEN,
        "last_tick": WHEN,
        "last_job_id": 48_210_334,
        "last_job_status": "cancelled",
    }
    rows = [
        {**base, "name": "weekday-digest-for-the-whole-sales-team", "paused": False},
        {**base, "name": "beat", "cron": None, "every_seconds": 30, "paused": True},
        {**base, "name": "missed", "missed_since": WHEN, "paused": False},
    ]
    return [{**r, "missed_since": r.get("missed_since")} for r in rows]


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("fmt", ["table", "plain"])
def test_the_schedule_listing_fits_and_keeps_names_and_ticks_readable(width: int, fmt: str) -> None:
    rows = [_schedule_cells(r) for r in schedule_records()]
    out = io.StringIO()
    emit_rows(rows, SCHEDULE_COLUMNS, fmt, stream=out, width=width)
    lines = out.getvalue().splitlines()
    assert all(len(line) <= width for line in lines), [len(line) for line in lines]
    shown = table_cells(lines)
    assert len(shown) == len(rows)
    for cells in shown:
        assert {"name", "next_tick", "missed_since"} <= set(cells)
        assert TIME.fullmatch(cells["next_tick"]), cells
    assert shown[2]["missed_since"] and shown[0]["missed_since"] == ""
    assert shown[1]["paused"] == "paused"


def test_no_value_is_cut_while_an_empty_column_is_shown() -> None:
    rows = [{"name": "nightly", "timing": "cron */15 9-17 * * mon-fri", "paused": ""}]
    layout = fit(rows, ["name", "timing", "paused"], 40)
    # Was: the cron expression cut to 14 beside an empty `paused` (rank 0).
    assert layout.columns == ["name", "timing"]
    assert layout.widths[1] == len("cron */15 9-17 * * mon-fri")


@pytest.mark.parametrize(
    ("ids", "shown"),
    [([], ""), ([7], "7"), ([9, 10, 11, 12, 13, 14, 20], "9-14, 20"), ([3, 1, 2, 5], "1-3, 5")],
)
def test_job_ids_that_follow_each_other_read_as_ranges(ids: list[int], shown: str) -> None:
    assert id_ranges(ids) == shown


@pytest.mark.parametrize(
    ("wanted", "available", "given"),
    [
        ([3, 12, 2], 14, [3, 9, 2]),  # top at 80x30: every worker, the leases cut
        ([3, 12, 2], 100, [3, 12, 2]),
        ([20, 20, 20], 14, [6, 4, 4]),  # a fair share each, the rest in order
        ([1, 1, 1], -5, [0, 0, 0]),
    ],
)
def test_top_shares_the_rows_of_the_terminal(
    wanted: list[int], available: int, given: list[int]
) -> None:
    assert share_rows(wanted, available) == given
