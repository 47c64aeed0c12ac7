"""`workers`: the registry of workers, as a table or as records."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pgqctl.output.formats import Record, emit_rows, is_human
from pgqctl.text import format_seconds, id_ranges

WORKER_COLUMNS = [
    "host",
    "pid",
    "state",
    "queues",
    "kinds",
    "concurrency",
    "running",
    "done",
    "failed",
    "version",
    "started_at",
    "last_seen",
    "jobs",
    "prefetched",
]


def _worker_cells(worker: Mapping[str, Any]) -> dict[str, Any]:
    """A worker as the table shows it: `all` for no --queue (--kind), when it
    was last seen as an age, the jobs it holds (running, prefetched) as their ids."""
    return {
        **worker,
        "queues": ",".join(worker["queues"]) or "all",
        "kinds": ",".join(worker["kinds"]) or "all",
        "last_seen": format_seconds(max(float(worker["seen_seconds_ago"]), 0.0)) + " ago",
        "jobs": id_ranges(worker["jobs"]),
        "prefetched": id_ranges(worker["prefetched"]),
    }


def emit_workers(workers: Sequence[Record], fmt: str, fields: Sequence[str]) -> None:
    """Workers as a table, or as records of their `fields`."""
    records = [w.as_record() for w in workers]
    if is_human(fmt):
        emit_rows([_worker_cells(r) for r in records], WORKER_COLUMNS, fmt)
    else:
        emit_rows(records, fields, fmt)
