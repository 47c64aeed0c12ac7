"""`pgqctl failures`: failed jobs grouped by kind and cause, so that
thousands of failures read as the few causes behind them.

A cause is what `list` shows of a failure (the first line of last_error,
then the job's last line of output), with its numbers made one placeholder;
the grouping runs in the database (sql/queries/failures.sql), whatever the
number of failed jobs. Nothing here prints.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pgqctl.rows import named_rows


@dataclass(frozen=True)
class Cause:
    """Failed jobs of one kind with one cause."""

    kind: str
    pattern: str  # the cause with its numbers as N (and UUIDs as U)
    jobs: int
    first_seen: dt.datetime
    last_seen: dt.datetime
    example_id: int  # the one that failed last
    example: str  # its cause as written

    def as_record(self) -> dict[str, Any]:
        return asdict(self)


FIELDS = tuple(Cause.__dataclass_fields__)


@dataclass(frozen=True)
class Failures:
    causes: list[Cause]  # the most frequent first
    total: int  # failed jobs matched, in every group (shown or not)


def failures(
    conn: Any,
    *,
    queues: Sequence[str] = (),
    kinds: Sequence[str] = (),
    since: float | None = None,
    limit: int | None = 20,
) -> Failures:
    """Failed jobs (of these queues and kinds, finished within `since`
    seconds) by kind and cause; at most `limit` causes (None: all)."""
    rows = named_rows(
        conn,
        "failure_groups",
        {
            "queues": list(queues) or None,
            "kinds": list(kinds) or None,
            "since": None if since is None else dt.timedelta(seconds=since),
            "limit": limit,
        },
    )
    total = int(rows[0]["total"]) if rows else 0
    causes = [Cause(**{name: row[name] for name in FIELDS}) for row in rows]
    return Failures(causes, total)
