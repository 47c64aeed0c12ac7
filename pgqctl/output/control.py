"""Paused queues, as `pause`, `resume` and the other views show a pause."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from pgqctl.output.formats import Record, emit_rows, is_human
from pgqctl.text import human


def pause_summary(until: dt.datetime | None, reason: str | None) -> str:
    """A pause on one line: `until 2026-12-02 10:30:00+00:00: smtp down`."""
    end = "until resumed" if until is None else f"until {human(until)}"
    return f"{end}: {reason}" if reason else end


PAUSE_COLUMNS = ["queue", "until", "reason", "paused_at"]


def emit_pauses(pauses: Sequence[Record], fmt: str, fields: Sequence[str]) -> None:
    """Pauses as a table (an open end shown as `until resumed`), or as records."""
    records = [p.as_record() for p in pauses]
    if is_human(fmt):
        cells = [{**r, "until": r["until"] or "until resumed"} for r in records]
        emit_rows(cells, PAUSE_COLUMNS, fmt)
    else:
        emit_rows(records, fields, fmt)
