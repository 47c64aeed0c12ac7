"""Flow limits, as `limit list`, `limit set` and `stats` show them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgqctl.flow import LIMIT_FIELDS, Limit
from pgqctl.output.formats import emit_rows, is_human
from pgqctl.text import format_seconds, one_line

LIMIT_COLUMNS = ["limit", "allows", "running", "held_back", "waiting"]


def limit_name(limit: Limit) -> str:
    return f"{limit.scope} {limit.name}"


def limit_cells(limit: Limit) -> dict[str, Any]:
    """One limit for a human: its target, its rule, and how it stands."""
    running = str(limit.running)
    if limit.concurrency is not None:
        running = f"{limit.running}/{limit.concurrency}"
    held = str(limit.held_back)
    if limit.full_keys:
        held += f" ({limit.full_keys} full key{'s' if limit.full_keys != 1 else ''})"
    return {
        "limit": limit_name(limit),
        "allows": limit.rule(),
        "running": running,
        "held_back": held,
        "waiting": (
            ""
            if not limit.held_back or limit.held_back_seconds is None
            else format_seconds(max(limit.held_back_seconds, 0.0))
        ),
    }


def limit_summary(limit: Limit) -> str:
    """A limit on one line: `limit of kind report (concurrency 3): 3 running,
    1,997 held back, the oldest for 41s`."""
    cells = limit_cells(limit)
    held = f"{limit.held_back:,} held back"
    if cells["waiting"]:
        held += f", the oldest for {cells['waiting']}"
    return (
        f"limit of {one_line(cells['limit'])} ({cells['allows']}): "
        f"{cells['running']} running, {held}"
    )


def emit_limits(limits: Sequence[Limit], fmt: str) -> None:
    """Limits as a table (running of concurrency, held back due jobs and
    how long the oldest has waited), or as records."""
    if is_human(fmt):
        emit_rows([limit_cells(lim) for lim in limits], LIMIT_COLUMNS, fmt)
    else:
        emit_rows([lim.as_record() for lim in limits], LIMIT_FIELDS, fmt)
