"""What a row of `jobs` may hold, read safely.

Plain SQL is a documented way to enqueue, so a row may hold what no pgqctl
command would write: a payload of 100 MB, one nested thousands of levels
deep (PostgreSQL accepts about 6,000; Python's json gives up near 1,000,
and every recursive walk of the decoded value sooner), a payload that is
not an object, names with control or invisible characters, times no Python
datetime holds ('infinity': pgqctl/fartime.py). The reads of `payload` and
`last_error` therefore take a bounded prefix in SQL (the `{job}` columns of
sql/queries/rows.sql, `left(...)` of one character more than is kept, so that a
cut is known without measuring the whole), and `decode` turns a payload's
text into a value, or says why it cannot.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pgqctl import limits
from pgqctl.limits import MAX_PAYLOAD_DEPTH, nested_deeper_than
from pgqctl.sql import query

# The characters of a payload and of a last_error the read commands take:
# a payload any pgqctl command accepts is shown whole, a longer one (only
# plain SQL stores one) is cut; a worker's last_error is a few kilobytes.
SHOWN_PAYLOAD_CHARS = limits.MAX_PAYLOAD_BYTES
SHOWN_ERROR_CHARS = 64 * 1024


@dataclass(frozen=True)
class Unreadable:
    """A claimed job's payload that no program can be given: why, in a
    sentence that fits a job's last_error."""

    reason: str


def decode(text: str) -> tuple[Any, str | None]:
    """A payload's JSON text as a value, or (None, why it is not decoded)."""
    if nested_deeper_than(text, MAX_PAYLOAD_DEPTH):
        return None, f"nested more than {MAX_PAYLOAD_DEPTH} levels deep"
    try:
        return json.loads(text), None
    except (ValueError, RecursionError) as exc:
        return None, f"not decodable as JSON ({exc})"


def claimed_payload(
    text: str, *, kind: str, queue: str, max_bytes: int
) -> dict[str, Any] | Unreadable:
    """What a worker's claim read: the payload to run, or why the job can
    never run. `text` is the payload's JSON text, cut by the claim to
    `max_bytes` + 1 characters."""
    # A character takes one byte or more: more characters than bytes allowed
    # is too many bytes, and only text that is not ASCII needs encoding.
    if len(text) > max_bytes or (not text.isascii() and len(text.encode()) > max_bytes):
        return Unreadable(
            f"payload is over the worker's limit of {max_bytes:,} bytes of JSON text: "
            "enqueue a smaller payload (e.g. a reference to where the data is), "
            "or raise the limit with `pgqctl worker --max-payload-bytes`"
        )
    for what, name in (("kind", kind), ("queue", queue)):
        why = limits.unprintable(name)  # the rule `enqueue` holds names to
        if why is not None:
            return Unreadable(
                f"{what} {json.dumps(name)} {why}: "
                f"enqueue the job again with a {what} of printable characters"
            )
    value, why = decode(text)
    if why is not None:
        return Unreadable(f"payload is {why}: enqueue a flatter payload")
    if not isinstance(value, dict):
        found = "an array" if isinstance(value, list) else f"a JSON {_json_kind(value)}"
        return Unreadable(
            f'payload is {found}, not an object: enqueue an object, e.g. {{"argv": [...]}}'
        )
    return value


def _json_kind(value: object) -> str:
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


@dataclass(frozen=True)
class Shown:
    """A payload and a last_error as a read command shows them."""

    payload: Any
    # Why `payload` is its JSON text (a str) rather than the value: cut, or
    # too deep to decode; None when it is the value.
    payload_note: str | None
    payload_cut: bool
    last_error: str | None
    last_error_cut: bool


def shown(row: Mapping[str, Any]) -> Shown:
    """The payload and last_error of a row read with the `{job}` columns:
    each at most its SHOWN_* characters, decoded when whole."""
    text: str = row["payload_head"]
    payload_cut = len(text) > SHOWN_PAYLOAD_CHARS
    note: str | None
    if payload_cut:
        text = text[:SHOWN_PAYLOAD_CHARS]
        payload: Any = text
        note = f"cut: the first {SHOWN_PAYLOAD_CHARS:,} characters of its JSON text"
    else:
        payload, why = decode(text)
        note = None if why is None else f"{why}: its JSON text"
        if why is not None:
            payload = text
    error: str | None = row["last_error_head"]
    error_cut = error is not None and len(error) > SHOWN_ERROR_CHARS
    if error is not None and error_cut:
        error = error[:SHOWN_ERROR_CHARS]
    return Shown(payload, note, payload_cut, error, error_cut)


# The parameters of the `{job}` columns: one character more than is kept.
READ_PARAMS = {"payload_chars": SHOWN_PAYLOAD_CHARS + 1, "error_chars": SHOWN_ERROR_CHARS + 1}


@functools.cache
def with_job_columns(text: str) -> str:
    """A statement with the bounded columns of a job (job_columns) in place of `{job}`."""
    return text.replace("{job}", query("job_columns"))


def job_rows(conn: Any, text: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run a statement in its own transaction (or the caller's); each row as
    a dict. Its `{job}` columns are the bounded ones: whatever a row holds,
    it is read in bounded memory."""
    from psycopg.rows import dict_row

    from pgqctl.db import atomic

    # Always pass a dict, so `%%` in a query means `%` whether it has
    # placeholders or not.
    with atomic(conn), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(with_job_columns(text), {**READ_PARAMS, **(params or {})})
        rows: list[dict[str, Any]] = cur.fetchall()
        return rows


def named_rows(
    conn: Any, name: str, params: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Run a named query (`job_rows`)."""
    return job_rows(conn, query(name), params)
