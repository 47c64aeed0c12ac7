"""Validation of job records, shared by the CLI (one job, a file) and the Python API."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from pgqctl.errors import BadInput
from pgqctl.intake.fields import (
    NewJob as Job,
)
from pgqctl.intake.fields import (
    job_from_record,
    make_job,
    parse_payload,
    parse_run_at,
)
from pgqctl.intake.lines import read_rows


def test_defaults() -> None:
    assert make_job("hello") == Job("hello", "{}", "default", 0, 3, None, 0.0)


def test_every_field() -> None:
    job = make_job(
        "resize",
        {"image": 7, "name": "café"},
        queue="images",
        priority=-5,
        delay="1h30m",
        max_attempts=9,
    )
    assert job == Job("resize", '{"image":7,"name":"café"}', "images", -5, 9, None, 5400.0)


@pytest.mark.parametrize(
    "delay, seconds",
    [(30, 30.0), (2.5, 2.5), ("5m", 300.0), (dt.timedelta(minutes=2), 120.0), (0, 0.0)],
)
def test_delay_forms(delay: Any, seconds: float) -> None:
    assert make_job("k", delay=delay).delay == seconds


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"kind": ""}, "kind must not be empty"),
        ({"kind": " \t"}, "kind must not be empty or only spaces"),
        ({"kind": "k", "payload": {"n": float("inf")}}, "holds NaN, Infinity or a number beyond"),
        ({"kind": 3}, "kind must be a string, not a number"),
        ({"kind": "k", "payload": [1]}, "payload must be a JSON object, not an array"),
        ({"kind": "k", "payload": "{}"}, "payload must be a JSON object, not a string"),
        ({"kind": "k", "payload": {"t": dt.date(2030, 1, 1)}}, "cannot be stored as JSON"),
        ({"kind": "k", "payload": {"x": float("nan")}}, "cannot be stored as JSON"),
        ({"kind": "k", "payload": {"x": "a\x00b"}}, "NUL character"),
        ({"kind": "k\x00"}, "kind contains a NUL character"),
        ({"kind": "k", "payload": {"x": "\ud800"}}, "unpaired surrogate"),
        ({"kind": "k", "queue": ""}, "queue must not be empty"),
        ({"kind": "k", "priority": "high"}, "priority must be an integer, not a string"),
        ({"kind": "k", "priority": True}, "priority must be an integer, not a boolean"),
        ({"kind": "k", "priority": 2**31}, "priority must be from"),
        ({"kind": "k", "max_attempts": 0}, "max_attempts must be from 1 to"),
        ({"kind": "k", "max_attempts": 1.5}, "max_attempts must be an integer, not a number"),
        ({"kind": "k", "delay": -1}, "non-negative"),
        ({"kind": "k", "delay": "soon"}, "is not a duration"),
        ({"kind": "k", "delay": float("inf")}, "non-negative"),
        ({"kind": "k", "delay": 10**12}, "more than 100 years"),
        ({"kind": "k", "delay": [1]}, "delay must be seconds or a duration"),
        ({"kind": "k", "run_at": "tomorrow"}, "is not an ISO 8601 time"),
        ({"kind": "k", "run_at": 1700000000}, "run_at must be an ISO 8601 time or a datetime"),
        ({"kind": "k", "run_at": "2030-01-01T00:00:00Z", "delay": 5}, "run_at or delay"),
        ({"kind": "k", "run_at": "9999-12-31T23:59:59-12:00"}, "out of range: years 1 to 9999"),
        ({"kind": "k", "run_at": "0001-01-01T00:00:00+14:00"}, "out of range: years 1 to 9999"),
    ],
)
def test_bad_fields_name_the_problem(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(BadInput, match=message.replace("(", r"\(")):
        make_job(**fields)


def test_bad_input_is_a_value_error_for_python_callers() -> None:
    with pytest.raises(ValueError):
        make_job("")


def test_a_backslash_before_u0000_is_not_a_nul() -> None:
    assert make_job("k", {"path": "C:\\u0000"}).payload == '{"path":"C:\\\\u0000"}'


def test_run_at_offsets_and_z() -> None:
    utc = dt.timezone.utc
    assert parse_run_at("2030-01-02T03:04:05Z") == dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=utc)
    assert parse_run_at("2030-01-02T05:04:05+02:00") == dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=utc)


def test_naive_run_at_is_local_time() -> None:
    parsed = parse_run_at("2030-06-01T12:00:00")
    assert parsed.tzinfo is not None
    assert parsed == dt.datetime(2030, 6, 1, 12, 0).astimezone()
    naive = dt.datetime(2030, 6, 1, 12, 0)
    assert parse_run_at(naive) == naive.astimezone()


def test_record_nulls_count_as_absent() -> None:
    record = {"kind": "k", "payload": None, "queue": None, "delay": None}
    assert job_from_record(record) == make_job("k")


@pytest.mark.parametrize(
    "record, message",
    [
        ([1, 2], "expected an object"),
        ({"payload": {}}, 'missing "kind"'),
        ({"kind": "k", "priorty": 1}, "unknown key 'priorty'; known keys: kind, payload"),
    ],
)
def test_bad_records(record: object, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        job_from_record(record)


def test_defaults_fill_what_a_record_leaves_out() -> None:
    defaults = {"queue": "bulk", "priority": 4, "delay": 60.0}
    assert job_from_record({"kind": "k"}, defaults) == make_job(
        "k", queue="bulk", priority=4, delay=60
    )
    own = job_from_record({"kind": "k", "queue": "mine", "run_at": "2030-01-01T00:00Z"}, defaults)
    assert (own.queue, own.priority, own.delay) == ("mine", 4, 0.0)
    assert own.run_at == dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)


def kinds(rows: list[str]) -> list[str]:
    """The kind column of COPY rows (none of these kinds needs escaping)."""
    return [row.split("\t")[1] for row in rows]


def test_read_rows_skips_blank_lines_and_counts_physical_lines() -> None:
    lines = [b'\xef\xbb\xbf{"kind": "a"}\n', b"\n", b"   \n", b'{"kind": "b"}\n', b'{"kind": 1}\n']
    rows = read_rows(lines, source="f.jsonl")
    assert kinds([next(rows), next(rows)]) == ["a", "b"]
    with pytest.raises(BadInput, match=r"^f\.jsonl, line 5: kind must be a string"):
        next(rows)


@pytest.mark.parametrize(
    "line, message",
    [
        (b'{"kind": "a",}', r"line 1: invalid JSON: Expecting property name .* at column 14"),
        (b'{"kind": "a", "payload": {"x": NaN}}', "line 1: invalid JSON: NaN is not a JSON value"),
        (b'{"kind": "\xff"}', r"line 1: not valid UTF-8 \(byte 11\)"),
        (b'["kind"]', "line 1: expected an object"),
        (b'{"kind": "a"} {"kind": "b"}', "line 1: invalid JSON: Extra data at column 15"),
        (
            b'{"kind": "a", "payload": {"x": 1e400}}',
            "line 1: payload cannot be stored as JSON: it holds",
        ),
        (b'{"kind": "a", "payload": {"x": "\\u0000"}}', "line 1: payload contains a NUL"),
        (b'{"kind": "a", "payload": {"x": "\\ud800"}}', "line 1: payload contains an unpaired"),
        (b'{"kind": "a\\u0000"}', "line 1: kind contains a NUL"),
        (b'{"kind": "a", "queue": ""}', "line 1: queue must not be empty"),
        (b'{"kind": " "}', "line 1: kind must not be empty or only spaces"),
        (b'{"kind": "a", "queue": "  "}', "line 1: queue must not be empty or only spaces"),
        (b'{"kind": "a", "priority": 1.0}', "line 1: priority must be an integer, not a number"),
        (b'{"kind": "a", "max_attempts": true}', "line 1: max_attempts must be an integer, not a "),
        (b'{"kind": "a", "payload": []}', "line 1: payload must be a JSON object, not an array"),
        (b'{"kind": "a", "payload": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}", "nested too deep"),
    ],
)
def test_read_rows_bad_lines(line: bytes, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        list(read_rows([line]))


def test_parse_payload_says_where_json_breaks() -> None:
    assert parse_payload('{"n": 1}') == {"n": 1}
    with pytest.raises(BadInput, match="Expecting value at line 2 column 7"):
        parse_payload('{"a": 1,\n "b": }')
    with pytest.raises(BadInput, match="must be a JSON object"):
        parse_payload("[1]")
    with pytest.raises(BadInput, match="nested too deeply"):
        parse_payload('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
