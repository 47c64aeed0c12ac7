"""The public API, re-exported by the package: ``pgqctl.enqueue`` and ``pgqctl.enqueue_many``.

::

    import pgqctl

    with conn.transaction():
        conn.execute("INSERT INTO orders ...")
        pgqctl.enqueue(conn, "send_receipt", {"order_id": 42})

Both use the caller's psycopg connection and never commit: the jobs become
visible, and workers are woken, when the caller's transaction commits (in
autocommit mode each call is its own transaction). The limits of
pgqctl/limits.py are checked with the rest, before anything is sent.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, overload

from pgqctl.errors import BadInput
from pgqctl.intake.copy_rows import job_row
from pgqctl.intake.fanout import check_kinds, fan_out, row_number
from pgqctl.intake.fields import (
    NewJob,
    check_kind,
    job_from_record,
    jobs_from_record,
    make_job,
    payload_limit,
)
from pgqctl.intake.lines import record_rows, simple_defaults, simple_record_row
from pgqctl.intake.loading import COPY_MIN_JOBS, insert_jobs, insert_rows
from pgqctl.intake.unique import DuplicateJob, check_on_conflict
from pgqctl.limits import MAX_PAYLOAD_BYTES

if TYPE_CHECKING:
    import psycopg

__all__ = ["DuplicateJob", "enqueue", "enqueue_many"]


@overload
def enqueue(
    conn: psycopg.Connection[Any],
    kind: str,
    payload: Mapping[str, Any] | None = None,
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: dt.datetime | str | None = None,
    delay: float | dt.timedelta | None = None,
    max_attempts: int = 3,
    unique_key: str | None = None,
    limit_key: str | None = None,
    on_conflict: str = "skip",
    schema: str | None = None,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> int: ...


@overload
def enqueue(
    conn: psycopg.Connection[Any],
    kind: list[str] | tuple[str, ...],
    payload: Mapping[str, Any] | None = None,
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: dt.datetime | str | None = None,
    delay: float | dt.timedelta | None = None,
    max_attempts: int = 3,
    unique_key: str | None = None,
    limit_key: str | None = None,
    on_conflict: str = "skip",
    schema: str | None = None,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> list[int]: ...


def enqueue(
    conn: psycopg.Connection[Any],
    kind: str | list[str] | tuple[str, ...],
    payload: Mapping[str, Any] | None = None,
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: dt.datetime | str | None = None,
    delay: float | dt.timedelta | None = None,
    max_attempts: int = 3,
    unique_key: str | None = None,
    limit_key: str | None = None,
    on_conflict: str = "skip",
    schema: str | None = None,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> int | list[int]:
    """Insert one job in the connection's current transaction; return its id.

    ``run_at`` (a datetime or ISO 8601 text; naive means local time) or
    ``delay`` (seconds or a timedelta) set when it becomes due; default now.
    ``unique_key``: while a pending or running job of the queue has this key,
    no other is inserted; ``on_conflict="skip"`` returns that job's id,
    ``"error"`` raises DuplicateJob. ``limit_key``: the key of per-key limits
    (`pgqctl limit set --per-key N`): at most N jobs of one key run at once.
    ``schema=None`` uses the connection's search_path. A payload over
    ``max_payload_bytes`` as JSON is refused (pgqctl.limits has the limits on
    names and keys too).

    A list of kinds inserts one job per kind for the payload, all or none,
    and returns their ids in its order; a unique key then holds per kind
    (pgqctl/intake/fanout.py), a limit key goes to every job as given.
    """
    limit = payload_limit(max_payload_bytes)
    listed = isinstance(kind, (list, tuple))
    kinds = check_kinds(kind, check_kind, "kind") if listed else None
    job = make_job(
        kind if kinds is None else kinds[0],
        payload,
        queue=queue,
        priority=priority,
        run_at=run_at,
        delay=delay,
        max_attempts=max_attempts,
        unique_key=unique_key,
        limit_key=limit_key,
        max_payload_bytes=limit,
    )
    if kinds is None:
        return insert_jobs(conn, [job], schema=schema, on_conflict=on_conflict)[0]
    return insert_jobs(conn, fan_out(job, kinds), schema=schema, on_conflict=on_conflict)


def enqueue_many(
    conn: psycopg.Connection[Any],
    jobs: Iterable[Mapping[str, Any]],
    *,
    on_conflict: str = "skip",
    schema: str | None = None,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> list[int]:
    """Insert many jobs (through COPY from COPY_MIN_JOBS on); return their ids in order.

    Each job is a mapping with the keys of `enqueue`'s arguments: ``kind``
    (required), ``payload``, ``queue``, ``priority``, ``run_at``, ``delay``,
    ``max_attempts``, ``unique_key``, ``limit_key``; or ``kinds``, a list,
    instead of ``kind``, for one job per kind (their ids in its order, in the
    place of the mapping's). A bad one raises BadInput naming its index,
    and nothing is inserted: in the caller's transaction, all are validated
    before anything is sent, and the transaction is left as it was; in
    autocommit mode, jobs stream to the server as they are validated, and
    the call's own transaction is rolled back. A job whose unique key is held
    (by a job in the queue, or by an earlier one of these) gets the holder's
    id under ``on_conflict="skip"`` (the list's ``existing`` holds their
    positions); under ``"error"`` nothing is inserted and DuplicateJob (or
    BadInput, for a key given twice) is raised. ``max_payload_bytes``: as
    for `enqueue`.
    """
    check_on_conflict(on_conflict)
    limit = payload_limit(max_payload_bytes)
    records = list(jobs)
    if len(records) < COPY_MIN_JOBS:
        valid: list[NewJob] = []
        numbers: list[int | str] = []
        for number, record in enumerate(records, start=1):
            try:
                made = jobs_from_record(record, max_payload_bytes=limit)
            except BadInput as exc:
                raise BadInput(f"jobs[{number - 1}]: {exc}") from None
            valid += made
            numbers += (row_number(number, position) for position in range(len(made)))
        return insert_jobs(conn, valid, schema=schema, on_conflict=on_conflict, numbers=numbers)
    rows: Iterator[str] = _record_rows(records, limit)
    # As many rows as records, but for a record of several kinds.
    expected = len(records)
    if not conn.autocommit:
        # In the caller's transaction: all checked before anything is sent,
        # so that a bad job leaves that transaction as it was. In autocommit
        # mode the call's own transaction is rolled back instead, and jobs
        # go to the server while the next ones are checked.
        checked = list(rows)
        rows, expected = iter(checked), len(checked)
    return insert_rows(conn, rows, schema=schema, on_conflict=on_conflict, expected=expected)


def _record_rows(records: list[Mapping[str, Any]], limit: int) -> Iterator[str]:
    """The COPY rows of enqueue_many's records, lazily; BadInput names the first bad one."""
    fast = simple_defaults(None, limit)
    for number, record in enumerate(records, start=1):
        try:
            row = None if fast is None else simple_record_row(number, record, fast)
            if row is None and isinstance(record, (dict, Mapping)) and "kinds" in record:
                yield from record_rows(number, record, None, limit)
                continue
            yield row or job_row(number, job_from_record(record, max_payload_bytes=limit))
        except BadInput as exc:
            raise BadInput(f"jobs[{number - 1}]: {exc}") from None
