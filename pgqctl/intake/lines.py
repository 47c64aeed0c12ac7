"""JSON lines read into COPY rows (pgqctl/intake/copy_rows.py), lazily.

Each line takes one of two paths. The quick one checks a job of the common
shape inline and makes its row at once; the full one decodes the line and
checks it field by field (`fields.job_from_record`). Both accept the same
lines and refuse the same lines with the same message: tests feed both the
same inputs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypeGuard

from pgqctl.errors import BadInput
from pgqctl.intake.copy_rows import copy_text, job_row, limit_key_column, timing_columns
from pgqctl.intake.fanout import row_number
from pgqctl.intake.fields import (
    DECODER,
    INT4_MAX,
    INT4_MIN,
    check_command,
    check_policy,
    encode,
    job_from_record,
    jobs_from_record,
    make_job,
    quick_encode,
    without_nulls,
)
from pgqctl.limits import (
    MAX_KEY_CHARS,
    MAX_NAME_CHARS,
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_DEPTH,
    nested_deeper_than,
    payload_bytes,
)

if TYPE_CHECKING:
    from pgqctl.policy import Policy


def record_rows(
    number: int, record: object, defaults: Mapping[str, Any] | None, max_payload_bytes: int
) -> list[str]:
    """The COPY rows of a record that takes the general path, numbered
    `number`. The bulk paths call it only for a record with "kinds": a
    record of one job goes straight to job_from_record, as it runs per job."""
    jobs = jobs_from_record(record, defaults, max_payload_bytes=max_payload_bytes)
    return [job_row(row_number(number, position), job) for position, job in enumerate(jobs)]


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
    fast = simple_defaults(defaults, max_payload_bytes)
    # This runs per line of a bulk load: a line of one job costs no list.
    no_rows: list[str] = []
    for number, raw in enumerate(lines, start=1):
        if not raw or raw.isspace():
            continue
        more = no_rows  # the rows of a line's other kinds
        try:
            text = _line_text(raw, number)
            row = None if fast is None else simple_line_row(number, text, fast)
            if row is None:
                record = decode_line(text)
                if type(record) is dict and "kinds" in record:  # inline: it runs per line
                    row, *more = record_rows(number, record, defaults, max_payload_bytes)
                else:
                    job = job_from_record(record, defaults, max_payload_bytes=max_payload_bytes)
                    row = job_row(number, job)
            if policy is not None:
                # Valid jobs by now; their kinds and payload are never defaults.
                record = decode_line(text)
                for kind in record.get("kinds") or [record["kind"]]:
                    check_policy(kind, record.get("payload"), policy)
        except BadInput as exc:
            raise BadInput(f"{source}, line {number}: {exc}") from None
        yield row
        if more:
            yield from more


def _line_text(raw: bytes, number: int) -> str:
    try:
        # Without its line end, so that an error's column is within the line.
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise BadInput(f"not valid UTF-8 (byte {exc.start + 1})") from None
    return text.removeprefix("\ufeff") if number == 1 else text


def decode_line(text: str) -> Any:
    try:
        # raw_decode skips decode's two whitespace regexes; a line it does not
        # take whole goes through decode, for its exact error.
        value, end = DECODER.raw_decode(text)
        if end == len(text):
            return value
    except (ValueError, RecursionError):
        pass
    try:
        return DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
    except ValueError as exc:
        raise BadInput(f"invalid JSON: {exc}") from None
    except RecursionError:
        raise BadInput("invalid JSON: nested too deeply") from None


# The common job, quickly.
#
# A bulk load spends most of its client time here, once per job. A job in the
# common shape is checked inline, without make_job's call per field, and made
# into its COPY row at once; from a JSON line, its payload is passed on as the
# line spells it when that can be done safely (jsonb parses and normalises it
# in any case). Any other job, and any job this code is not sure of, takes
# the general path (job_from_record, job_row), which accepts it or names what
# is wrong with it. Both paths give a row that holds the same job.

# The keys a job may have here; one that sets its own run_at or delay goes
# through make_job, which parses them.
_SIMPLE_FIELDS = frozenset(("kind", "payload", "queue", "priority", "max_attempts", "limit_key"))
_KIND_AND_PAYLOAD = frozenset(("kind", "payload"))
_DEFAULTABLE = frozenset(("queue", "priority", "max_attempts", "run_at", "delay", "limit_key"))
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
    parse_constant=DECODER.parse_constant, parse_float=_float_in_range
)
# Set by JSONDecoder's __init__, but not in typeshed.
_SCAN: Callable[[str, int], tuple[Any, int]] = _SIMPLE_DECODER.scan_once  # type: ignore[attr-defined]


class _Defaults(NamedTuple):
    """What a job that sets only _SIMPLE_FIELDS gets for the others."""

    queue: str
    priority: int
    max_attempts: int
    timing: str  # the run_at and delay columns
    limit_key: str  # the limit_key column, with its tab; "" for none (copy_rows.job_row)
    tail: str  # the columns from queue on, for a job that sets none of them (nor a unique key)
    max_payload_bytes: int
    # Payloads up to this many characters are surely within the limits (if
    # ASCII); lines up to short_line, whatever they hold (_surely_fits).
    short_payload: int
    short_line: int
    names: dict[str, str]  # kinds found good, as COPY fields
    encode: Callable[[Any], str]  # a payload's JSON text (fields.quick_encode)


def simple_defaults(
    defaults: Mapping[str, Any] | None, max_payload_bytes: int = MAX_PAYLOAD_BYTES
) -> _Defaults | None:
    """`defaults` (see job_from_record) for the quick path; None: every job takes the other."""
    values = without_nulls(defaults or {})
    if not _DEFAULTABLE.issuperset(values):
        return None
    try:
        base = make_job("-", **values)
    except BadInput:
        return None  # each job then reports it, or overrides it, as job_from_record does
    timing = timing_columns(base)
    limit_key = limit_key_column(base.limit_key)
    tail = (
        f"{copy_text(base.queue)}\t{base.priority}\t{base.max_attempts}\t{timing}{limit_key}\t\\N\n"
    )
    short = min(max_payload_bytes, 2 * MAX_PAYLOAD_DEPTH)
    return _Defaults(
        base.queue,
        base.priority,
        base.max_attempts,
        timing,
        limit_key,
        tail,
        max_payload_bytes,
        short,
        min(max_payload_bytes // 5, 2 * MAX_PAYLOAD_DEPTH),
        {},
        quick_encode(),
    )


def simple_line_row(number: int, text: str, defaults: _Defaults) -> str | None:
    """The row of a JSON line in the common shape; None for any other line.

    The line's text tells what make_job's checks look for: JSON can only
    spell a NUL or an unpaired surrogate as a \\u escape, and a backslash,
    tab, newline or carriage return inside a string as a backslash escape.
    """
    escaped = "\\" in text
    if escaped and "\\u" in text:
        return None
    try:
        # scan_once, not raw_decode: one Python call less per line.
        record, end = _SCAN(text, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    if end != len(text) or type(record) is not dict:
        return None
    tail = defaults.tail if _KIND_AND_PAYLOAD.issuperset(record) else _simple_tail(record, defaults)
    kind = record.get("kind")
    if tail is None or type(kind) is not str:
        return None
    # Without a \\u escape, a kind _simple_name takes holds no NUL nor surrogate.
    name = defaults.names.get(kind) or _checked_name(kind, defaults.names)
    if name is None or (len(text) > defaults.short_line and not _surely_fits(text, defaults)):
        return None
    payload = record.get("payload")
    if payload is None:
        return f"{number}\t{name}\t{{}}\t{tail}"
    if type(payload) is not dict:
        return None
    if "argv" in payload or "shell" in payload:
        check_command(payload, kind)
    payload_text = None if escaped else _payload_as_written(text)
    if payload_text is None:
        try:
            payload_text = encode(payload)
        except (ValueError, RecursionError):
            return None
    return f"{number}\t{name}\t{copy_text(payload_text)}\t{tail}"


def simple_record_row(number: int, record: object, defaults: _Defaults) -> str | None:
    """The row of a job given as a dict in the common shape; None for any other."""
    if type(record) is not dict:
        return None
    # Inline, not through _simple_tail, for the commonest record: this runs per job.
    tail = defaults.tail if _KIND_AND_PAYLOAD.issuperset(record) else _simple_tail(record, defaults)
    kind = record.get("kind")
    if tail is None or type(kind) is not str:
        return None
    name = defaults.names.get(kind) or _checked_name(kind, defaults.names)
    if name is None:
        return None
    payload = record.get("payload")
    if payload is None:
        return f"{number}\t{name}\t{{}}\t{tail}"
    if type(payload) is not dict:
        return None
    if "argv" in payload or "shell" in payload:
        check_command(payload, kind)
    try:
        text = defaults.encode(payload)
    except (TypeError, ValueError, RecursionError):
        return None
    # The common payload: ASCII without escapes, short. Its size in bytes is
    # its length, it cannot hold a NUL, it needs no escaping for COPY, and
    # it cannot nest deeper than half its length.
    if not text.isascii() or "\\" in text or len(text) > defaults.short_payload:
        unusual = _unusual_payload(text, defaults)
        if unusual is None:
            return None
        text = unusual
    return f"{number}\t{name}\t{text}\t{tail}"


def _checked_name(kind: str, names: dict[str, str]) -> str | None:
    """A kind that surely passes make_job's checks, as a COPY field,
    remembered (a load has few kinds, each checked once); None for any other."""
    if not _simple_name(kind) or not _storable(kind):
        return None
    if len(names) < _NAMES_KEPT:
        names[kind] = copy_text(kind)
    return copy_text(kind)


_NAMES_KEPT = 1000


def _unusual_payload(text: str, defaults: _Defaults) -> str | None:
    """A payload's JSON text that is not the common one, as a COPY field if
    it surely passes make_job's checks; None for any other."""
    if "\\u0000" in text or not _storable(text):
        return None
    if payload_bytes(text) > defaults.max_payload_bytes or nested_deeper_than(
        text, MAX_PAYLOAD_DEPTH
    ):
        return None
    return copy_text(text)


def _simple_tail(record: dict[str, Any], defaults: _Defaults) -> str | None:
    """The columns from queue on of a job in the common shape; None for any other job."""
    if _KIND_AND_PAYLOAD.issuperset(record):
        return defaults.tail
    if not _SIMPLE_FIELDS.issuperset(record):
        return None
    queue = record.get("queue")
    priority = record.get("priority")
    max_attempts = record.get("max_attempts")
    limit_key = record.get("limit_key")
    if limit_key is None:
        limit_column = defaults.limit_key
    elif _simple_key(limit_key) and _storable(limit_key):
        limit_column = f"\t{copy_text(limit_key)}"
    else:
        return None
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
        return (
            f"{copy_text(queue)}\t{priority}\t{max_attempts}\t{defaults.timing}{limit_column}"
            "\t\\N\n"
        )
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


def _simple_key(key: object) -> TypeGuard[str]:
    """Whether a limit key surely passes make_job's checks of a key, as
    _simple_name for a name (the same checks, with the key's limit)."""
    return (
        type(key) is str
        and 0 < len(key) <= MAX_KEY_CHARS
        and key.isprintable()
        and not key.isspace()
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
    """Whether PostgreSQL text holds `text` as it is (what fields._check_storable checks)."""
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
    """The payload object's own text in a line `simple_line_row` has checked, if it is last.

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
