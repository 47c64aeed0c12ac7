"""Schedules, as the `schedule` commands write them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pgqctl.output.formats import Record, emit_record, emit_rows, is_human

SCHEDULE_COLUMNS = [
    "name",
    "timing",
    "timezone",
    "next_tick",
    "last_tick",
    "job",
    "job_status",
    "paused",
    "missed_since",
]


def emit_schedules(schedules: Sequence[Record], fmt: str, fields: Sequence[str]) -> None:
    """Schedules as a table (`missed_since`: the first tick not enqueued in
    time, while one is), or as records of their `fields`."""
    records = [s.as_record() for s in schedules]
    if is_human(fmt):
        emit_rows([_schedule_cells(r) for r in records], SCHEDULE_COLUMNS, fmt)
    else:
        emit_rows(records, fields, fmt)


def _schedule_cells(r: Mapping[str, Any]) -> dict[str, Any]:
    from pgqctl.schedules import Timing

    every = r["every_seconds"]
    timing = Timing(r["cron"], every, r["timezone"]).describe()
    return {
        **r,
        "timing": timing,
        "timezone": r["timezone"] if every is None else "",
        "job": r["last_job_id"],
        # A purged job has no status left to show.
        "job_status": r["last_job_status"] or ("purged" if r["last_job_id"] else ""),
        "paused": "paused" if r["paused"] else "",
    }


def emit_schedule(schedule: Record, fmt: str) -> None:
    """One schedule whole (`schedule show`): for people, its payload pretty-printed."""
    record = schedule.as_record()
    if is_human(fmt):
        record["payload"] = json.dumps(record["payload"], indent=2, ensure_ascii=False)
    emit_record(record, fmt)


SYNC_COLUMNS = ["action", "name", "fields"]


def emit_sync(changes: Sequence[Record], fmt: str) -> None:
    """What a sync changes: one row per schedule added, updated or removed."""
    records = [c.as_record() for c in changes]
    if is_human(fmt):
        cells = [{**r, "fields": ", ".join(r["fields"])} for r in records]
        emit_rows(cells, SYNC_COLUMNS, fmt)
    else:
        emit_rows(records, SYNC_COLUMNS, fmt)
