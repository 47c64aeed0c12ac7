"""Enqueue jobs inside the caller's transaction: one, many, or a JSON-lines file.

The public API, re-exported by the package::

    import pgqctl

    with conn.transaction():
        conn.execute("INSERT INTO orders ...")
        pgqctl.enqueue(conn, "send_receipt", {"order_id": 42})

Both functions use the caller's psycopg connection and never commit: the jobs
become visible, and workers are woken, when the caller's transaction commits
(in autocommit mode each call is its own transaction). Bad input raises
``BadInput`` (a ``ValueError``) before anything is sent to the database.
Whatever the connection (direct, or through a session or transaction
pooler), nothing they send leans on it: no statement is prepared (`_run`),
no setting is changed, and the staging table of a bulk load goes with the
transaction. The limits of pgqctl/limits.py are checked with the rest.

Every job is checked as `make_job` checks it: field by field, or, for the
many jobs of a bulk load that have the common shape, by quicker inline checks
that accept exactly what make_job accepts (tests compare the two). Bulk jobs
become rows of COPY's text format (`read_rows` for a JSON-lines file) that
`insert_rows` loads; `insert_jobs` sends a few jobs in one INSERT. psycopg
and threads are imported only when jobs are inserted, so ``import pgqctl``
stays cheap.

Note: the package exports the *function* ``enqueue`` under the name of this
module, so import from it with ``from pgqctl.enqueue import ...``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple, TypeGuard, overload

from pgqctl.durations import parse_duration
from pgqctl.errors import BadInput, PgqctlError
from pgqctl.fanout import check_kinds, fan_out, record_number, row_number
from pgqctl.limits import (
    MAX_KEY_CHARS,
    MAX_NAME_CHARS,
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_DEPTH,
    check_name,
    check_payload,
    nested_deeper_than,
    payload_bytes,
)
from pgqctl.sql import query

if TYPE_CHECKING:
    from concurrent.futures import Future

    import psycopg
    from psycopg import sql

    from pgqctl.policy import Policy

# The keys a job record may have (a JSON line, or a mapping given to enqueue_many);
# "kinds" instead of "kind" makes one job per kind (pgqctl/fanout.py).
FIELDS = (
    "kind", "payload", "queue", "priority", "run_at", "delay", "max_attempts", "unique_key",
    "kinds",
)  # fmt: skip
_FIELD_SET = frozenset(FIELDS)
INT4_MIN, INT4_MAX = -(2**31), 2**31 - 1
# Longer delays are typos, and would overflow timestamps.
MAX_DELAY_SECONDS = 100 * 365 * 86400
# Below this many jobs, one INSERT from arrays; from it on, COPY into a
# temporary table, whose few milliseconds of setup pay off only in bulk.
COPY_MIN_JOBS = 200
CHUNK_JOBS = 10_000
FIRST_CHUNK_JOBS = 500
# A bulk load read before its transaction keeps this much in memory, the
# rest in a temporary file.
SPOOL_MEMORY = 16 * 1024 * 1024

_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# What a job whose unique key is taken does: skip it (the holder's id is
# given back instead) or fail the whole call.
ON_CONFLICT = ("skip", "error")


class NewJob(NamedTuple):
    """One validated job, ready to insert (a tuple: cheap by the hundred thousand)."""

    kind: str
    payload: str  # JSON text of an object
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 3
    run_at: dt.datetime | None = None  # timezone-aware; None means now() + delay
    delay: float = 0.0  # seconds after the inserting transaction's now()
    # At most one pending or running job per (queue, unique_key); None: no key.
    unique_key: str | None = None


class Ids(list[int]):
    """The ids of the jobs given, in order. `existing` holds the positions
    (from 0) of the jobs that were not inserted because a pending or running
    job held their unique key: that job's id stands in their place."""

    def __init__(self, ids: Iterable[int] = ()) -> None:
        super().__init__(ids)
        self.existing: set[int] = set()

    def add(self, ids: Sequence[int], existing: Sequence[bool] = ()) -> None:
        """Append the ids of more jobs, with whether each was there already
        (none, when `existing` is empty)."""
        if existing:
            self.existing.update(len(self) + i for i, held in enumerate(existing) if held)
        self.extend(ids)


class DuplicateJob(PgqctlError):
    """A job's unique key is held by a pending or running job (on_conflict="error").

    Nothing the call was given is inserted.
    """

    def __init__(self, queue: str, unique_key: str, holder: int, status: str) -> None:
        self.queue, self.unique_key, self.holder, self.status = queue, unique_key, holder, status
        super().__init__(
            f"job {holder} ({status}) already has unique key {unique_key!r} in queue "
            f"{queue!r}: nothing was enqueued; `--on-conflict skip` gives its id instead"
        )


# ---------------------------------------------------------------- public API


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
    on_conflict: str = "skip",
    schema: str | None = None,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> int | list[int]:
    """Insert one job in the connection's current transaction; return its id.

    ``run_at`` (a datetime or ISO 8601 text; naive means local time) or
    ``delay`` (seconds or a timedelta) set when it becomes due; default now.
    ``unique_key``: while a pending or running job of the queue has this key,
    no other is inserted; ``on_conflict="skip"`` returns that job's id,
    ``"error"`` raises DuplicateJob. ``schema=None`` uses the connection's
    search_path. A payload over ``max_payload_bytes`` as JSON is refused
    (pgqctl.limits has the limits on names too).

    A list of kinds inserts one job per kind for the payload, all or none,
    and returns their ids in its order; a unique key then holds per kind
    (pgqctl/fanout.py).
    """
    limit = _payload_limit(max_payload_bytes)
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
    ``max_attempts``, ``unique_key``; or ``kinds``, a list, instead of
    ``kind``, for one job per kind (their ids in its order, in the place of
    the mapping's). All are validated before anything is
    sent; a bad one raises BadInput naming its index. A job whose unique key
    is held (by a job in the queue, or by an earlier one of these) gets the
    holder's id under ``on_conflict="skip"`` (the list's ``existing`` holds
    their positions); under ``"error"`` nothing is inserted and DuplicateJob (or
    BadInput, for a key given twice) is raised. ``max_payload_bytes``: as
    for `enqueue`.
    """
    _check_on_conflict(on_conflict)
    limit = _payload_limit(max_payload_bytes)
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
    # Made into COPY rows now, so that loading them is all the work left.
    fast = _simple_defaults(None, limit)
    rows = []
    for number, record in enumerate(records, start=1):
        try:
            row = None if fast is None else _simple_record_row(number, record, fast)
            if row is None and isinstance(record, (dict, Mapping)) and "kinds" in record:
                rows += _record_rows(number, record, None, limit)
                continue
            rows.append(row or _job_row(number, job_from_record(record, max_payload_bytes=limit)))
        except BadInput as exc:
            raise BadInput(f"jobs[{number - 1}]: {exc}") from None
    return insert_rows(conn, rows, schema=schema, on_conflict=on_conflict)


def _index_name(number: int) -> str:
    return f"jobs[{number - 1}]"


def _check_on_conflict(on_conflict: str) -> None:
    if on_conflict not in ON_CONFLICT:
        raise BadInput(f"on_conflict must be 'skip' or 'error', not {on_conflict!r}")


def _payload_limit(max_payload_bytes: object) -> int:
    return _int4("max_payload_bytes", max_payload_bytes, 1)


# ---------------------------------------------------------------- validation


def make_job(
    kind: object,
    payload: object = None,
    *,
    queue: object = "default",
    priority: object = 0,
    run_at: object = None,
    delay: object = None,
    max_attempts: object = 3,
    unique_key: object = None,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> NewJob:
    """Validate one job's fields; BadInput names the field and what is wrong."""
    if run_at is not None and delay is not None:
        raise BadInput("give run_at or delay, not both")
    name = _text("kind", kind)
    text = _payload_text(payload, max_payload_bytes)
    if isinstance(payload, (dict, Mapping)) and ("argv" in payload or "shell" in payload):
        check_command(payload, name)
    return NewJob(
        name,
        text,
        _text("queue", queue),
        _int4("priority", priority, INT4_MIN),
        _int4("max_attempts", max_attempts, 1),
        None if run_at is None else parse_run_at(run_at),
        0.0 if delay is None else _delay_seconds(delay),
        None if unique_key is None else _text("unique_key", unique_key, MAX_KEY_CHARS),
    )


def job_from_record(
    record: object,
    defaults: Mapping[str, Any] | None = None,
    *,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> NewJob:
    """A job from a mapping of FIELDS; null values count as absent.

    ``defaults`` fill keys the record lacks; a record that sets its own
    run_at or delay ignores both timing defaults.
    """
    if not isinstance(record, (dict, Mapping)):
        raise BadInput(
            f'expected an object like {{"kind": "...", "payload": {{}}}}, got {_kind_of(record)}'
        )
    if not _FIELD_SET.issuperset(record):
        unknown = next(k for k in record if k not in _FIELD_SET)
        raise BadInput(f"unknown key {unknown!r}; known keys: {', '.join(FIELDS)}")
    # The common case, a record without nulls, is used as it is: this runs per line.
    values = record if None not in record.values() else _without_nulls(record)
    if defaults:
        values = _with_defaults(values, defaults)
    if "kind" not in values:
        raise BadInput('missing "kind" (or "kinds", a list, for one job per kind)')
    if "kinds" in values:
        raise BadInput('give "kind" or "kinds", not both')
    return make_job(**values, max_payload_bytes=max_payload_bytes)


def jobs_from_record(
    record: object,
    defaults: Mapping[str, Any] | None = None,
    *,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> list[NewJob]:
    """The jobs of a record (see job_from_record): one, or with "kinds" one per kind."""
    if (
        not isinstance(record, (dict, Mapping))
        or record.get("kinds") is None
        or record.get("kind") is not None  # job_from_record says: not both
    ):
        return [job_from_record(record, defaults, max_payload_bytes=max_payload_bytes)]
    names = check_kinds(record["kinds"], check_kind, '"kinds"')
    first = {**record, "kinds": None, "kind": names[0]}
    return fan_out(job_from_record(first, defaults, max_payload_bytes=max_payload_bytes), names)


def _record_rows(
    number: int, record: object, defaults: Mapping[str, Any] | None, max_payload_bytes: int
) -> list[str]:
    """The COPY rows of a record that takes the general path, numbered
    `number`. The bulk paths call it only for a record with "kinds": a
    record of one job goes straight to job_from_record, as it runs per job."""
    jobs = jobs_from_record(record, defaults, max_payload_bytes=max_payload_bytes)
    return [_job_row(row_number(number, position), job) for position, job in enumerate(jobs)]


def check_kind(kind: object) -> str:
    """A job's kind, checked; BadInput says what is wrong with it."""
    return _text("kind", kind)


def check_command(payload: Mapping[str, Any], kind: str) -> None:
    """BadInput for an argv or shell payload a worker would refuse (unknown
    keys, an argv that is not a list of strings...), as pgqctl/payload.py,
    which defines payloads, says; a payload with neither key is a handler's.

    Imported here, not at the top: `import pgqctl` stays cheap, and a load
    of handler payloads never imports it.
    """
    try:
        _check_payload(payload, kind)
    except _PayloadRejected as exc:  # read when raised: the class, once imported
        raise BadInput(f"payload cannot run: {exc}") from None


def check_policy(kind: str, payload: object, policy: Policy) -> None:
    """BadInput for a job a worker under `policy` would refuse (see
    `payload.check_policy`): ``pgqctl enqueue --policy``."""
    from pgqctl.payload import PayloadRejected
    from pgqctl.payload import check_policy as check

    try:
        check({} if payload is None else payload, kind, policy)
    except PayloadRejected as exc:
        raise BadInput(f"refused by the policy in {policy.source}: {exc}") from None


class _NotYetImported(Exception):
    """What check_command catches until pgqctl.payload is imported."""


def _import_check(payload: Mapping[str, Any], kind: str) -> None:
    """The first check: import payload.check_payload, then run it from now on
    with no more than a call (it runs once per job of a bulk load)."""
    global _check_payload, _PayloadRejected
    from pgqctl.payload import PayloadRejected, check_payload

    _check_payload, _PayloadRejected = check_payload, PayloadRejected
    check_payload(payload, kind)


_check_payload: Callable[[Mapping[str, Any], str], None] = _import_check
_PayloadRejected: type[Exception] = _NotYetImported


def _without_nulls(record: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if v is not None}


def _with_defaults(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults under values; values that set run_at or delay drop both timing defaults."""
    timing = ("run_at", "delay")
    if any(k in values for k in timing):
        defaults = {k: v for k, v in defaults.items() if k not in timing}
    return {**_without_nulls(defaults), **values}


def parse_payload(text: str) -> dict[str, Any]:
    """The JSON object a user typed as a payload, or BadInput saying where it breaks."""
    try:
        value = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise BadInput(
            f"payload is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}; "
            """give an object such as '{"n": 1}'"""
        ) from None
    except ValueError as exc:
        raise BadInput(f"payload is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadInput("payload is not valid JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise BadInput(
            f"""payload must be a JSON object such as '{{"n": 1}}', not {_kind_of(value)}"""
        )
    return value


def parse_run_at(value: object, *, what: str = "run_at") -> dt.datetime:
    """An aware datetime from a datetime or ISO 8601 text; naive means local time.

    `what` names the value in errors; "" when the caller's message names it.
    """
    shown = value.strip() if isinstance(value, str) else str(value)
    named = f"{what} " if what else ""
    if isinstance(value, str):
        text = value.strip()
        # Python 3.10's fromisoformat does not know the Z suffix.
        if text[-1:] in ("Z", "z"):
            text = text[:-1] + "+00:00"
        try:
            value = dt.datetime.fromisoformat(text)
        except ValueError:
            raise BadInput(
                f"{named}{value!r} is not an ISO 8601 time such as 2030-01-31T09:00:00+01:00"
            ) from None
    if not isinstance(value, dt.datetime):
        raise BadInput(f"{named}must be an ISO 8601 time or a datetime, not {_kind_of(value)}")
    try:
        # astimezone() reads a naive time as local time, the least surprising reading.
        aware = value if value.tzinfo is not None else value.astimezone()
        # Stored in UTC and read back as a Python datetime: it must be one there.
        aware.astimezone(dt.timezone.utc)
    except (OverflowError, ValueError, OSError):
        raise BadInput(f"{named}{shown!r} is out of range: years 1 to 9999 in UTC") from None
    return aware


def read_rows(
    lines: Iterable[bytes],
    *,
    source: str = "input",
    defaults: Mapping[str, Any] | None = None,
    policy: Policy | None = None,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> Iterator[str]:
    """The COPY rows (see `insert_rows`) of a JSON-lines input, lazily.

    Each line is validated as `jobs_from_record` validates a record, with
    ``defaults`` filling what it leaves out, then checked against `policy`
    when one is given; blank lines are skipped. BadInput names the first bad
    line (counting every physical line from 1). A line with "kinds" gives
    one row per kind.
    """
    fast = _simple_defaults(defaults, max_payload_bytes)
    # This runs per line of a bulk load: a line of one job costs no list.
    no_rows: list[str] = []
    for number, raw in enumerate(lines, start=1):
        if not raw or raw.isspace():
            continue
        more = no_rows  # the rows of a line's other kinds
        try:
            text = _line_text(raw, number)
            row = None if fast is None else _simple_line_row(number, text, fast)
            if row is None:
                record = _decode_text(text)
                if type(record) is dict and "kinds" in record:  # inline: it runs per line
                    row, *more = _record_rows(number, record, defaults, max_payload_bytes)
                else:
                    job = job_from_record(record, defaults, max_payload_bytes=max_payload_bytes)
                    row = _job_row(number, job)
            if policy is not None:
                # Valid jobs by now; their kinds and payload are never defaults.
                record = _decode_text(text)
                for kind in record.get("kinds") or [record["kind"]]:
                    check_policy(kind, record.get("payload"), policy)
        except BadInput as exc:
            raise BadInput(f"{source}, line {number}: {exc}") from None
        yield row
        if more:
            yield from more


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


_encode = _ENCODER.encode
_DECODER = json.JSONDecoder(
    # Python accepts NaN and Infinity; JSON and PostgreSQL do not.
    parse_constant=lambda name: _reject(f"{name} is not a JSON value"),
)


def _reject(message: str) -> Any:
    raise ValueError(message)


def _line_text(raw: bytes, number: int) -> str:
    try:
        # Without its line end, so that an error's column is within the line.
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise BadInput(f"not valid UTF-8 (byte {exc.start + 1})") from None
    return text.removeprefix("\ufeff") if number == 1 else text


def _decode_text(text: str) -> Any:
    try:
        # raw_decode skips decode's two whitespace regexes; a line it does not
        # take whole goes through decode, for its exact error.
        value, end = _DECODER.raw_decode(text)
        if end == len(text):
            return value
    except (ValueError, RecursionError):
        pass
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
    except ValueError as exc:
        raise BadInput(f"invalid JSON: {exc}") from None
    except RecursionError:
        raise BadInput("invalid JSON: nested too deeply") from None


# --------------------------------------------------- the common job, quickly
#
# A bulk load spends most of its client time here, once per job. A job in the
# common shape is checked inline, without make_job's call per field, and made
# into its COPY row at once; from a JSON line, its payload is passed on as the
# line spells it when that can be done safely (jsonb parses and normalises it
# in any case). Any other job, and any job this code is not sure of, takes
# the general path (job_from_record, _job_row), which accepts it or names what
# is wrong with it. Both paths give a row that holds the same job.

# The keys a job may have here; one that sets its own run_at or delay goes
# through make_job, which parses them.
_SIMPLE_FIELDS = frozenset(("kind", "payload", "queue", "priority", "max_attempts"))
_KIND_AND_PAYLOAD = frozenset(("kind", "payload"))
_DEFAULTABLE = frozenset(("queue", "priority", "max_attempts", "run_at", "delay"))
_JSON_SPACE = " \t\n\r"


def _float_in_range(text: str) -> float:
    """A JSON number with a fraction or an exponent as a float, if one holds it.

    One that overflows or underflows is refused here (the general path then
    rejects it or stores what a float keeps of it), so that a payload passed
    on as written never holds a number PostgreSQL and make_job would read
    differently.
    """
    value = float(text)
    if sys.float_info.min <= abs(value) <= sys.float_info.max:
        return value
    if value == 0.0 and not text.lower().partition("e")[0].strip("-0."):
        return value  # a zero as written
    raise ValueError(f"{text} is beyond the range of a float")


_SIMPLE_DECODER = json.JSONDecoder(
    parse_constant=_DECODER.parse_constant, parse_float=_float_in_range
)


class _Defaults(NamedTuple):
    """What a job that sets only _SIMPLE_FIELDS gets for the others."""

    queue: str
    priority: int
    max_attempts: int
    timing: str  # the run_at and delay columns
    tail: str  # the columns from queue on, for a job that sets none of them (and no key)
    max_payload_bytes: int


def _simple_defaults(
    defaults: Mapping[str, Any] | None, max_payload_bytes: int = MAX_PAYLOAD_BYTES
) -> _Defaults | None:
    """`defaults` (see job_from_record) for the quick path; None: every job takes the other."""
    values = _without_nulls(defaults or {})
    if not _DEFAULTABLE.issuperset(values):
        return None
    try:
        base = make_job("-", **values)
    except BadInput:
        return None  # each job then reports it, or overrides it, as job_from_record does
    timing = _timing_columns(base)
    tail = f"{_copy_text(base.queue)}\t{base.priority}\t{base.max_attempts}\t{timing}\t\\N\n"
    return _Defaults(base.queue, base.priority, base.max_attempts, timing, tail, max_payload_bytes)


def _simple_line_row(number: int, text: str, defaults: _Defaults) -> str | None:
    """The row of a JSON line in the common shape; None for any other line.

    The line's text tells what make_job's checks look for: JSON can only
    spell a NUL or an unpaired surrogate as a \\u escape, and a backslash,
    tab, newline or carriage return inside a string as a backslash escape.
    """
    escaped = "\\" in text
    if escaped and "\\u" in text:
        return None
    try:
        record, end = _SIMPLE_DECODER.raw_decode(text)
    except (ValueError, RecursionError):
        return None
    if end != len(text) or type(record) is not dict:
        return None
    tail = _simple_tail(record, defaults)
    kind = record.get("kind")
    if tail is None or not _simple_name(kind) or not _surely_fits(text, defaults):
        return None
    payload = record.get("payload")
    if payload is None:
        payload_text: str | None = "{}"
    elif type(payload) is not dict:
        return None
    else:
        if "argv" in payload or "shell" in payload:
            check_command(payload, kind)
        payload_text = None if escaped else _payload_as_written(text)
        if payload_text is None:
            try:
                payload_text = _encode(payload)
            except (ValueError, RecursionError):
                return None
        payload_text = _copy_text(payload_text)
    if escaped:
        kind = _copy_text(kind)
    return f"{number}\t{kind}\t{payload_text}\t{tail}"


def _simple_record_row(number: int, record: object, defaults: _Defaults) -> str | None:
    """The row of a job given as a dict in the common shape; None for any other."""
    if type(record) is not dict:
        return None
    tail = _simple_tail(record, defaults)
    kind = record.get("kind")
    if tail is None or not _simple_name(kind) or not _storable(kind):
        return None
    payload = record.get("payload")
    if payload is None:
        payload_text = "{}"
    elif type(payload) is not dict:
        return None
    else:
        if "argv" in payload or "shell" in payload:
            check_command(payload, kind)
        try:
            payload_text = _encode(payload)
        except (TypeError, ValueError, RecursionError):
            return None
        if "\\u0000" in payload_text or not _storable(payload_text):
            return None
        if payload_bytes(payload_text) > defaults.max_payload_bytes or nested_deeper_than(
            payload_text, MAX_PAYLOAD_DEPTH
        ):
            return None
    return f"{number}\t{_copy_text(kind)}\t{_copy_text(payload_text)}\t{tail}"


def _simple_tail(record: dict[str, Any], defaults: _Defaults) -> str | None:
    """The columns from queue on of a job in the common shape; None for any other job."""
    if _KIND_AND_PAYLOAD.issuperset(record):
        return defaults.tail
    if not _SIMPLE_FIELDS.issuperset(record):
        return None
    queue = record.get("queue")
    priority = record.get("priority")
    max_attempts = record.get("max_attempts")
    if queue is None:
        queue = defaults.queue
    if priority is None:
        priority = defaults.priority
    if max_attempts is None:
        max_attempts = defaults.max_attempts
    if (
        _simple_name(queue)
        and _storable(queue)
        and type(priority) is int
        and INT4_MIN <= priority <= INT4_MAX
        and type(max_attempts) is int
        and 1 <= max_attempts <= INT4_MAX
    ):
        return f"{_copy_text(queue)}\t{priority}\t{max_attempts}\t{defaults.timing}\t\\N\n"
    return None


def _simple_name(name: object) -> TypeGuard[str]:
    """Whether a kind or queue surely passes make_job's checks of a name,
    but for NUL and surrogates (see _storable): a name that is not printable
    may still be accepted, by make_job."""
    return (
        type(name) is str
        and 0 < len(name) <= MAX_NAME_CHARS
        and name.isprintable()
        and not name.isspace()
    )


def _surely_fits(line: str, defaults: _Defaults) -> bool:
    """Whether the payload of a JSON line is surely within the payload limit
    as make_job measures it: its compact JSON in UTF-8. That takes at most 5
    bytes per character of the line: a string's characters are the same (4
    bytes at most each), spaces go, and a number grows at most from `1e15`
    to `1000000000000000.0`. A longer line takes the general path, which
    measures the payload. A line nested deep takes it too: it measures the
    payload's depth."""
    return 5 * len(line) <= defaults.max_payload_bytes and not nested_deeper_than(
        line, MAX_PAYLOAD_DEPTH
    )


def _storable(text: str) -> bool:
    """Whether PostgreSQL text holds `text` as it is (what _check_storable checks)."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _payload_as_written(text: str) -> str | None:
    """The payload object's own text in a line `_simple_line_row` has checked, if it is last.

    Without a backslash in the line, every quote opens or closes a string,
    so a line holding the string "payload" once holds it as the key, and
    the line after it is ``: <payload> }``, or more keys after the payload.
    The payload is the one object among the checked fields: what ends in
    ``}`` before the line's closing brace is the payload, whole.
    """
    key = text.find('"payload"')
    if text.find('"payload"', key + 9) != -1:
        return None
    value = text[text.index(":", key + 9) + 1 : text.rindex("}")]
    return value if value.rstrip(_JSON_SPACE).endswith("}") else None


def _text(name: str, value: object, limit: int = MAX_NAME_CHARS) -> str:
    if not isinstance(value, str):
        raise BadInput(f"{name} must be a string, not {_kind_of(value)}")
    if not value or value.isspace():
        raise BadInput(f"{name} must not be empty or only spaces")
    _check_storable(name, value)
    check_name(name, value, limit)
    return value


def _check_storable(name: str, text: str) -> None:
    """PostgreSQL text holds neither NUL nor unpaired surrogates."""
    if "\x00" in text:
        raise BadInput(f"{name} contains a NUL character, which PostgreSQL cannot store")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadInput(f"{name} contains an unpaired surrogate (not valid Unicode)") from None


def _payload_text(payload: object, limit: int) -> str:
    if payload is None:
        return "{}"
    if not isinstance(payload, (dict, Mapping)):  # dict first: the ABC check is slow
        raise BadInput(f"payload must be a JSON object, not {_kind_of(payload)}")
    try:
        text = _encode(payload)
    except ValueError as exc:
        if "Out of range float" in str(exc):  # 1e400 reads as infinity
            raise BadInput(
                "payload cannot be stored as JSON: it holds NaN, Infinity "
                "or a number beyond about 1.8e308"
            ) from None
        raise BadInput(f"payload cannot be stored as JSON: {exc}") from None
    except (TypeError, RecursionError) as exc:
        raise BadInput(f"payload cannot be stored as JSON: {exc}") from None
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise BadInput("payload contains a NUL character (\\u0000), which jsonb cannot store")
    _check_storable("payload", text)
    check_payload(text, limit)
    return text


def _int4(name: str, value: object, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadInput(f"{name} must be an integer, not {_kind_of(value)}")
    if not low <= value <= INT4_MAX:
        raise BadInput(f"{name} must be from {low} to {INT4_MAX}, got {value}")
    return value


def _delay_seconds(value: object) -> float:
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str):
        seconds = parse_duration(value, what="delay")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise BadInput(
            f"delay must be seconds or a duration like 30s, 5m, 2h, not {_kind_of(value)}"
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise BadInput(f"delay must be a non-negative number of seconds, got {value!r}")
    if seconds > MAX_DELAY_SECONDS:
        raise BadInput(f"delay {value!r} is more than 100 years")
    return seconds


def _kind_of(value: object) -> str:
    """How a JSON user would name the type of a value."""
    names = {
        type(None): "null",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        tuple: "an array",
        dict: "an object",
    }
    return names.get(type(value), type(value).__name__)


# ------------------------------------------------------------------ bulk load


def check_defaults(defaults: Mapping[str, Any]) -> None:
    """BadInput for a bad value meant to fill what lines leave out: said once,
    not on every line."""
    make_job("-", **defaults)


def load(
    lines: Iterable[bytes],
    connect: Callable[[], psycopg.Connection[Any]],
    *,
    source: str = "input",
    defaults: Mapping[str, Any] | None = None,
    on_progress: Callable[[int], None] | None = None,
    read_first: bool = True,
    on_conflict: str = "skip",
    policy: Policy | None = None,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> Ids:
    """Check every job of a JSON-lines input and insert them all in one
    transaction; their ids in input order. An input with no job never
    connects; a bad line raises BadInput and nothing is inserted. Unique
    keys are handled as `enqueue_many` says (the first line with a key wins).

    `read_first`: read and check the whole input before the transaction
    starts, keeping the rows in a file once they outgrow SPOOL_MEMORY, so that
    a slow producer never holds a transaction open (a server's
    idle_in_transaction_session_timeout would end it). Without it, for a
    regular file that is read as fast as the disk goes, rows stream to the
    server as they are checked, and a bad one aborts the transaction.

    `policy`: also refuse a job a worker under it would refuse.
    """
    try:
        with _gc_skips_older_objects():
            rows = read_rows(
                lines,
                source=source,
                defaults=defaults,
                policy=policy,
                max_payload_bytes=max_payload_bytes,
            )
            if read_first:
                rows = _read_all(rows)
            # The first job is read before connecting, so an empty or plainly
            # wrong input never touches the database.
            first = next(rows, None)
            if first is None:
                return Ids()
            with connect() as conn:
                return insert_rows(
                    conn,
                    itertools.chain([first], rows),
                    on_progress=on_progress,
                    on_conflict=on_conflict,
                    where=lambda n: f"{source}, line {n}",
                )
    except BadInput as exc:
        raise BadInput(f"{exc}; nothing was enqueued") from None


def _read_all(rows: Iterator[str]) -> Iterator[str]:
    """Every row, all read (at the first `next`) before the first is given back."""
    import tempfile  # here: `import pgqctl` need not load it

    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY, mode="w+", encoding="utf-8") as f:
        # One row a line: COPY's text format escapes the line ends within a value.
        f.writelines(rows)
        f.seek(0)
        yield from f


@contextmanager
def _gc_skips_older_objects() -> Iterator[None]:
    """Keep the garbage collector's full passes off the objects that exist already.

    A bulk load makes short-lived objects by the hundred thousand, which
    triggers full passes; each would walk every module, class and function
    imported at startup again.
    """
    import gc

    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


# ------------------------------------------------------------------ inserting


def insert_jobs(
    conn: psycopg.Connection[Any],
    jobs: Iterable[NewJob],
    *,
    schema: str | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_conflict: str = "skip",
    where: Callable[[int], str] = _index_name,
    numbers: Iterable[int | str] | None = None,
) -> Ids:
    """Insert jobs in the connection's transaction; return their ids in order.

    A list of fewer than COPY_MIN_JOBS goes in one INSERT from arrays. Other
    jobs go through `insert_rows`, so ``jobs`` may be a lazy iterator that
    validates as it goes. Unique keys: see `enqueue_many`. ``numbers``: the
    rows' numbers (`fanout.row_number`), which errors give to `where`;
    default 1, 2, 3...
    """
    _check_on_conflict(on_conflict)
    numbered: Iterable[tuple[int | str, NewJob]] = (
        enumerate(jobs, start=1) if numbers is None else zip(numbers, jobs, strict=True)
    )
    if isinstance(jobs, Sequence) and len(jobs) < COPY_MIN_JOBS:
        if not jobs:
            return Ids()
        with _own_transaction(conn, on_conflict):
            table = _jobs_table(schema)
            if all(j.unique_key is None for j in jobs):
                return Ids(_insert_from_arrays(conn, jobs, table))
            with _cursor(conn) as cur:
                unique = _Unique(cur, table, on_conflict, where)
                ids = Ids()
                ids.add(*unique.insert_rows(list(itertools.starmap(_job_row, numbered))))
                return ids
    rows = itertools.starmap(_job_row, numbered)
    return insert_rows(
        conn, rows, schema=schema, on_progress=on_progress, on_conflict=on_conflict, where=where
    )


def insert_rows(
    conn: psycopg.Connection[Any],
    rows: Iterable[str],
    *,
    schema: str | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_conflict: str = "skip",
    where: Callable[[int], str] = _index_name,
) -> Ids:
    """Insert jobs given as COPY rows (`read_rows`, `_job_row`); return their ids in order.

    Rows stream through COPY in chunks, so ``rows`` may be a lazy iterator
    that validates as it goes: an exception it raises aborts the transaction.
    ``on_progress`` gets the number of jobs sent so far, now and then.

    Never commits an open transaction; in autocommit mode it wraps its
    statements in a transaction of its own (and, under on_conflict="error",
    in a savepoint inside the caller's, so that a conflict leaves none of
    these jobs behind). Workers get one notification however many jobs and
    statements: the table's statement trigger sends the same one each time,
    and PostgreSQL delivers a transaction's duplicates once.

    COPY stages rows in a temporary table; a role without the TEMP privilege
    inserts them from arrays instead, chunk by chunk (slower, same result).
    A chunk in which no job has a unique key takes the plain INSERT; one with
    keys, the INSERT ... ON CONFLICT DO NOTHING of `_Unique`.
    """
    _check_on_conflict(on_conflict)
    table = _jobs_table(schema)
    with _own_transaction(conn, on_conflict):
        with _cursor(conn) as cur:
            _run(cur, query("role_may_create_temp"))
            (may_stage,) = cur.fetchone() or (False,)
        if may_stage:
            return _insert_by_copy(conn, rows, table, on_progress, on_conflict, where)
        return _insert_by_arrays(conn, rows, table, on_progress, on_conflict, where)


@contextmanager
def _own_transaction(conn: psycopg.Connection[Any], on_conflict: str) -> Iterator[None]:
    """A transaction in autocommit mode; under on_conflict="error" a savepoint
    in the caller's, so that a conflict leaves none of this call's jobs
    there; else the caller's transaction as it is."""
    if conn.autocommit:
        with conn.transaction():
            yield
    elif on_conflict == "error":
        # On an idle connection a transaction() block would begin a
        # transaction and commit it at its end: the caller's to commit.
        # Any statement begins it (psycopg's implicit BEGIN), then the block
        # is a savepoint.
        if conn.info.transaction_status == _IDLE:
            with _cursor(conn) as cur:
                _run(cur, query("transaction_open"))
        with conn.transaction():
            yield
    else:
        yield


_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE, without importing psycopg here


def _job_row(number: int | str, job: NewJob) -> str:
    """A validated job as one line of COPY's text format, in the columns of jobs_load_copy.

    ``number`` orders the rows of a chunk: ids are given in that order
    (`fanout.row_number`).
    """
    return (
        f"{number}\t{_copy_text(job.kind)}\t{_copy_text(job.payload)}\t{_copy_text(job.queue)}"
        f"\t{job.priority}\t{job.max_attempts}\t{_timing_columns(job)}"
        f"\t{_NO_KEY if job.unique_key is None else _copy_text(job.unique_key)}\n"
    )


_NO_KEY = "\\N"
# How a COPY row without a unique key ends: a load none of whose rows has a
# key takes the plain INSERT, with no ON CONFLICT to pay for.
_KEYLESS_END = "\t\\N\n"


def _has_key(row: str) -> bool:
    return not row.endswith(_KEYLESS_END)


def _timing_columns(job: NewJob) -> str:
    # str(): the text psycopg itself sends for a datetime and a float.
    run_at = "\\N" if job.run_at is None else str(job.run_at)
    return f"{run_at}\t{job.delay}"


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(text: str) -> str:
    """Text as a field of COPY's text format, which gives these four characters a meaning.

    Validation has already refused NUL, which PostgreSQL text cannot hold.
    """
    if "\\" in text or "\t" in text or "\n" in text or "\r" in text:
        return text.translate(_COPY_ESCAPES)
    return text


def _cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[tuple[Any, ...]]:
    """A cursor on the caller's connection that gives tuples, whatever row
    factory the caller chose for the connection."""
    from psycopg.rows import tuple_row

    return conn.cursor(row_factory=tuple_row)


def _run(cur: psycopg.Cursor[Any], statement: str | sql.Composed, params: Any = None) -> None:
    """Every statement on the caller's connection goes through here: never as
    a prepared statement, whatever the connection's prepare_threshold.

    Behind a transaction pooler (PgBouncer before 1.21), a statement psycopg
    prepares stays on the server connection under a name such as _pg3_0, and
    another client given that server connection runs it when it executes its
    own _pg3_0: a job inserted into the other client's schema, or an error.
    """
    cur.execute(statement, params, prepare=False)


def _jobs_table(schema: str | None) -> sql.Identifier:
    from psycopg import sql

    return sql.Identifier("jobs") if schema is None else sql.Identifier(schema, "jobs")


def _statement(name: str, table: sql.Identifier) -> sql.Composed:
    from psycopg import sql

    return sql.SQL(query(name)).format(jobs=table)


def _insert_from_arrays(
    conn: psycopg.Connection[Any], jobs: Sequence[NewJob], table: sql.Identifier
) -> list[int]:
    columns = dict(zip(NewJob._fields, map(list, zip(*jobs, strict=True)), strict=True))
    with _cursor(conn) as cur:
        _run(cur, _statement("jobs_insert_arrays", table), columns)
        return [row[0] for row in cur.fetchall()]


def _insert_by_copy(
    conn: psycopg.Connection[Any],
    rows: Iterable[str],
    table: sql.Identifier,
    on_progress: Callable[[int], None] | None,
    on_conflict: str,
    where: Callable[[int], str],
) -> Ids:
    # COPY has no RETURNING: each chunk is staged in a temporary table and
    # moved with INSERT ... SELECT ... RETURNING id. A thread loads one chunk
    # while this one reads and validates the next, so that the client's and
    # the server's work overlap (psycopg releases the GIL while it waits).
    from concurrent.futures import ThreadPoolExecutor

    insert = _statement("jobs_insert_loaded", table)
    ids = Ids()
    with _cursor(conn) as cur, ThreadPoolExecutor(1) as loader:
        unique = _Unique(cur, table, on_conflict, where)
        _run(cur, query("jobs_load_create"))
        loading: Future[tuple[list[int], list[bool]]] | None = None
        sent = 0
        for chunk in _chunks(rows, CHUNK_JOBS):
            if loading is not None:
                ids.add(*loading.result())
            loading = loader.submit(_load_chunk, cur, chunk, insert, unique)
            sent += len(chunk)
            if on_progress is not None:
                on_progress(sent)
        if loading is not None:
            ids.add(*loading.result())
    return ids


def _insert_by_arrays(
    conn: psycopg.Connection[Any],
    rows: Iterable[str],
    table: sql.Identifier,
    on_progress: Callable[[int], None] | None,
    on_conflict: str,
    where: Callable[[int], str],
) -> Ids:
    """COPY rows inserted from arrays, a chunk a statement: no temporary table."""
    insert = _statement("jobs_insert_arrays", table)
    ids = Ids()
    with _cursor(conn) as cur:
        unique = _Unique(cur, table, on_conflict, where)
        for chunk in _chunks(rows, CHUNK_JOBS):
            if any(map(_has_key, chunk)):
                ids.add(*unique.insert_rows(chunk))
            else:
                _run(cur, insert, _row_columns(chunk))
                # Ids are drawn in the order of the rows; RETURNING's order is not promised.
                ids.extend(sorted(row[0] for row in cur.fetchall()))
            if on_progress is not None:
                on_progress(len(ids))
    return ids


def _row_columns(rows: Iterable[str]) -> dict[str, list[Any]]:
    """COPY rows as the arrays of jobs_insert_arrays, one per NewJob field."""
    columns: dict[str, list[Any]] = {name: [] for name in NewJob._fields}
    for row in rows:
        # n, then the job's fields in NewJob's order (see _job_row).
        fields = [_copy_value(f) for f in row.rstrip("\n").split("\t")][1:]
        for name, value in zip(NewJob._fields, fields, strict=True):
            columns[name].append(value)
    columns["priority"] = [int(v) for v in columns["priority"]]
    columns["max_attempts"] = [int(v) for v in columns["max_attempts"]]
    columns["delay"] = [float(v) for v in columns["delay"]]
    return columns


class _Unique:
    """Inserts chunks in which some jobs have a unique key, and finds the
    holder of each key that was taken.

    INSERT ... ON CONFLICT DO NOTHING returns only the rows it inserted:
    sorted by id they are the inserted rows in input order, so walking the
    input alongside tells, for each keyed job, whether it went in. A job that
    did not is held by a job of this load (a key given twice: the first
    wins), or by one already in the queue, which a second statement finds:
    it sees the holder even when it was committed by a concurrent producer
    that the INSERT waited for. Should the holder finish in between (the key
    is free again), those jobs are inserted again.
    """

    def __init__(
        self,
        cur: psycopg.Cursor[Any],
        table: sql.Identifier,
        on_conflict: str,
        where: Callable[[int], str],
    ) -> None:
        self.cur, self.table, self.on_conflict, self.where = cur, table, on_conflict, where
        self.loaded: dict[tuple[str, str], tuple[int, int]] = {}  # key -> (row n, job id)

    def insert_rows(self, rows: list[str]) -> tuple[list[int], list[bool]]:
        """Insert rows (some with keys) from arrays; their ids in order, and
        whether each job was there already."""
        _run(self.cur, _statement("jobs_insert_arrays_unique", self.table), _row_columns(rows))
        return self.resolve(rows, self.cur.fetchall())

    def resolve(
        self, rows: list[str], inserted: list[tuple[int, str, str | None]], tries: int = 5
    ) -> tuple[list[int], list[bool]]:
        """The ids of `rows`, given what their INSERT returned, and whether
        each job was there already."""
        ids, existing, taken = self._walk(rows, sorted(inserted))
        free = self._holders(ids, taken) if taken else []
        if free:
            # Their holders finished since the INSERT: the keys are free, insert these again.
            if tries == 1:
                raise PgqctlError("unique keys kept changing hands while enqueueing: try again")
            retry = [rows[i] for i in free]
            _run(self.cur, _statement("jobs_insert_arrays_unique", self.table), _row_columns(retry))
            again, held = self.resolve(retry, self.cur.fetchall(), tries - 1)
            for i, job_id, was in zip(free, again, held, strict=True):
                ids[i], existing[i] = job_id, was
        return [i for i in ids if i is not None], existing

    def _walk(
        self, rows: list[str], inserted: list[tuple[int, str, str | None]]
    ) -> tuple[list[int | None], list[bool], list[tuple[int, str, str]]]:
        """Each row's id if known yet, whether it was there already, and the
        rows held by a job not of this load: (index, queue, key)."""
        ids: list[int | None] = []
        existing: list[bool] = []
        taken: list[tuple[int, str, str]] = []
        p = 0
        for i, row in enumerate(rows):
            if not _has_key(row):
                ids.append(inserted[p][0])
                existing.append(False)
                p += 1
                continue
            fields = row.rstrip("\n").split("\t")
            n = record_number(fields[0])
            queue, key = _copy_value(fields[3]), _copy_value(fields[-1])
            assert queue is not None and key is not None
            first = self.loaded.get((queue, key))
            if first is None and p < len(inserted) and inserted[p][1:] == (queue, key):
                ids.append(inserted[p][0])
                existing.append(False)
                self.loaded[(queue, key)] = (n, inserted[p][0])
                p += 1
                continue
            existing.append(True)
            if first is None:
                ids.append(None)
                taken.append((i, queue, key))
            elif self.on_conflict == "error":
                raise BadInput(
                    f"{self.where(n)} repeats the unique key {key!r} (queue {queue!r}) "
                    f"of {self.where(first[0])}"
                )
            else:
                ids.append(first[1])
        return ids, existing, taken

    def _holders(self, ids: list[int | None], taken: list[tuple[int, str, str]]) -> list[int]:
        """Fill in the holders' ids; the indexes of the rows whose key no job holds now."""
        _run(
            self.cur,
            _statement("jobs_unique_holders", self.table),
            {"queue": [t[1] for t in taken], "unique_key": [t[2] for t in taken]},
        )
        holders = {(q, k): (job_id, status) for q, k, job_id, status in self.cur.fetchall()}
        free = []
        for i, queue, key in taken:
            held = holders.get((queue, key))
            if held is None:
                free.append(i)
            elif self.on_conflict == "error":
                raise DuplicateJob(queue, key, held[0], held[1])
            else:
                ids[i] = held[0]
        return free


_COPY_UNESCAPES = {"\\\\": "\\", "\\t": "\t", "\\n": "\n", "\\r": "\r"}
_COPY_ESCAPE = re.compile(r"\\[\\tnr]")


def _copy_value(field: str) -> str | None:
    """A field of COPY's text format as the value it stands for (see _copy_text)."""
    if field == "\\N":
        return None
    if "\\" not in field:
        return field
    return _COPY_ESCAPE.sub(lambda m: _COPY_UNESCAPES[m.group(0)], field)


def _load_chunk(
    cur: psycopg.Cursor[Any], rows: list[str], insert: sql.Composed, unique: _Unique
) -> tuple[list[int], list[bool]]:
    # Emptied first: the table may hold the rows of an earlier chunk, or of
    # an earlier load in the same transaction that stopped half way.
    _run(cur, query("jobs_load_truncate"))
    with cur.copy(query("jobs_load_copy")) as copy:
        copy.write("".join(rows))
    if any(map(_has_key, rows)):
        _run(cur, _statement("jobs_insert_loaded_unique", unique.table))
        return unique.resolve(rows, cur.fetchall())
    _run(cur, insert)
    return [row[0] for row in cur.fetchall()], []


def _chunks(rows: Iterable[str], size: int) -> Iterator[list[str]]:
    # Small at first, so that the server starts on the first rows while the
    # client reads the next ones, then growing to `size`.
    it = iter(rows)
    length = min(size, FIRST_CHUNK_JOBS)
    while chunk := list(itertools.islice(it, length)):
        yield chunk
        length = min(size, length * 4)
