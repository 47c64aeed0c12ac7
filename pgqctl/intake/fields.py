"""One job's fields, checked and normalised: `make_job`, and the records
(JSON lines, mappings given to enqueue_many) that hold them.

Every job is checked as `make_job` checks it: field by field here, or, for
the many jobs of a bulk load that have the common shape, by the quicker
inline checks of pgqctl/intake/lines.py, which accept exactly what make_job
accepts (tests compare the two).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from pgqctl.durations import parse_duration
from pgqctl.errors import BadInput
from pgqctl.intake.fanout import check_kinds, fan_out
from pgqctl.limits import (
    MAX_KEY_CHARS,
    MAX_NAME_CHARS,
    MAX_PAYLOAD_BYTES,
    check_name,
    check_payload,
)

if TYPE_CHECKING:
    from pgqctl.policy import Policy


# The keys a job record may have (a JSON line, or a mapping given to enqueue_many);
# "kinds" instead of "kind" makes one job per kind (pgqctl/intake/fanout.py).
FIELDS = (
    "kind", "payload", "queue", "priority", "run_at", "delay", "max_attempts", "unique_key",
    "limit_key", "kinds",
)  # fmt: skip
_FIELD_SET = frozenset(FIELDS)
INT4_MIN, INT4_MAX = -(2**31), 2**31 - 1
# Longer delays are typos, and would overflow timestamps.
MAX_DELAY_SECONDS = 100 * 365 * 86400

_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class NewJob(NamedTuple):
    """One validated job, ready to insert (a tuple: cheap by the hundred thousand)."""

    kind: str
    payload: str  # JSON text of an object
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 3
    run_at: dt.datetime | None = None  # timezone-aware; None means now() + delay
    delay: float = 0.0  # seconds after the inserting transaction's now()
    # The key of per-key limits (`pgqctl limit set --per-key`); None: no key.
    # Before unique_key, as in a COPY row (pgqctl/intake/copy_rows.py).
    limit_key: str | None = None
    # At most one pending or running job per (queue, unique_key); None: no key.
    unique_key: str | None = None


def payload_limit(max_payload_bytes: object) -> int:
    return _int4("max_payload_bytes", max_payload_bytes, 1)


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
    limit_key: object = None,
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
        None if limit_key is None else _text("limit_key", limit_key, MAX_KEY_CHARS),
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
            f'expected an object like {{"kind": "...", "payload": {{}}}}, got {kind_of(record)}'
        )
    if not _FIELD_SET.issuperset(record):
        unknown = next(k for k in record if k not in _FIELD_SET)
        raise BadInput(f"unknown key {unknown!r}; known keys: {', '.join(FIELDS)}")
    # The common case, a record without nulls, is used as it is: this runs per line.
    values = record if None not in record.values() else without_nulls(record)
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


def without_nulls(record: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if v is not None}


def _with_defaults(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults under values; values that set run_at or delay drop both timing defaults."""
    timing = ("run_at", "delay")
    if any(k in values for k in timing):
        defaults = {k: v for k, v in defaults.items() if k not in timing}
    return {**without_nulls(defaults), **values}


def parse_payload(text: str) -> dict[str, Any]:
    """The JSON object a user typed as a payload, or BadInput saying where it breaks."""
    try:
        value = DECODER.decode(text)
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
            f"""payload must be a JSON object such as '{{"n": 1}}', not {kind_of(value)}"""
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
        raise BadInput(f"{named}must be an ISO 8601 time or a datetime, not {kind_of(value)}")
    try:
        # astimezone() reads a naive time as local time, the least surprising reading.
        aware = value if value.tzinfo is not None else value.astimezone()
        # Stored in UTC and read back as a Python datetime: it must be one there.
        aware.astimezone(dt.timezone.utc)
    except (OverflowError, ValueError, OSError):
        raise BadInput(f"{named}{shown!r} is out of range: years 1 to 9999 in UTC") from None
    return aware


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


encode = _ENCODER.encode


def quick_encode() -> Callable[[Any], str]:
    """`encode` for a bulk load's payloads, made once a load: a circular
    payload then raises RecursionError, and make_job, which checks, names
    the problem. (Imported here: pgqctl.text is not needed to import pgqctl.)"""
    from pgqctl.text import quick_encoder

    return quick_encoder(_ENCODER)


DECODER = json.JSONDecoder(
    # Python accepts NaN and Infinity; JSON and PostgreSQL do not.
    parse_constant=lambda name: _reject(f"{name} is not a JSON value"),
)


def _reject(message: str) -> Any:
    raise ValueError(message)


def _text(name: str, value: object, limit: int = MAX_NAME_CHARS) -> str:
    if not isinstance(value, str):
        raise BadInput(f"{name} must be a string, not {kind_of(value)}")
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
        raise BadInput(f"payload must be a JSON object, not {kind_of(payload)}")
    try:
        text = encode(payload)
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
        raise BadInput(f"{name} must be an integer, not {kind_of(value)}")
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
            f"delay must be seconds or a duration like 30s, 5m, 2h, not {kind_of(value)}"
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise BadInput(f"delay must be a non-negative number of seconds, got {value!r}")
    if seconds > MAX_DELAY_SECONDS:
        raise BadInput(f"delay {value!r} is more than 100 years")
    return seconds


def kind_of(value: object) -> str:
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


def check_defaults(defaults: Mapping[str, Any]) -> None:
    """BadInput for a bad value meant to fill what lines leave out: said once,
    not on every line."""
    make_job("-", **defaults)
