"""The COPY rows a bulk load sends: one per job, the same whichever way a line is checked."""

from __future__ import annotations

import datetime as dt
import json
import random
import re
import sys
from typing import Any

import pytest

from pgqctl.enqueue import job_from_record, read_rows
from pgqctl.errors import BadInput

ENQUEUE = sys.modules["pgqctl.enqueue"]  # the package's `enqueue` is the function

# Lines in the shape most bulk files have: checked inline, without make_job.
COMMON = [
    '{"kind": "echo", "payload": {"argv": ["echo", "job 1"]}}',
    '{"kind":"a","payload":{"x":1}}',
    '{"payload": {"x": 1}, "kind": "a"}',
    '{"kind": "a", "payload": {"payload": {"y": 2}}}',
    '{"kind": "payload", "payload": {"kind": "payload"}}',
    '{"kind": "a", "payload": {"s": "tab\\there \\"q\\" back\\\\slash\\nline\\r"}}',
    '{"kind": "a\\tb\\\\c", "queue": "q\\nr", "payload": {}}',
    '{"kind": "\\\\N\\t"}',
    '{"kind": "a",\t"payload":\t{"x":\t1}\t}',
    '{"kind": "a", "payload": {"x": {}} }',
    '{"kind": "café", "payload": {"s": "ü€😀"}}',
    '{"kind": "a", "payload": {"f": 1.50, "z": 0.0, "n": -0, "e": 1E-5, "i": 98765432109876543}}',
    '{"kind": "a", "payload": null, "queue": null, "priority": null, "max_attempts": null}',
    '{"kind": "a", "queue": "q", "priority": -5, "max_attempts": 9, "payload": {"x": [1, {}]}}',
    '{"kind": "a"}',
]
# Lines that make_job checks: escapes that may hide a NUL, their own timing,
# numbers beyond a float's range, whitespace around the object.
GENERAL = [
    '{"kind": "a", "payload": {"s": "\\u00e9\\ud83d\\ude00"}}',
    '{"kind": "a", "delay": "5m", "payload": {"x": 1}}',
    '{"kind": "a", "run_at": "2030-01-01T00:00:00Z"}',
    '{"kind": "a", "payload": {"x": 1e-400, "y": 1.5e-310}}',
    ' {"kind": "a", "payload": {"x": 1}}  ',
    '{"kind": "a", "unique_key": "user:7\\t\\\\N", "payload": {"x": 1}}',
]
DEFAULTS: list[dict[str, Any] | None] = [
    None,
    {"queue": "bulk", "priority": 4, "delay": 60.0},
    {"max_attempts": 7, "run_at": dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)},
]

_COPY_ESCAPE = re.compile(r"\\(.)")
_COPY_CHARS = {"t": "\t", "n": "\n", "r": "\r", "\\": "\\"}


def copy_fields(row: str) -> list[str | None]:
    """The fields of one row of COPY's text format, as PostgreSQL reads them."""
    assert row.endswith("\n") and row.count("\n") == 1
    return [
        None if field == "\\N" else _COPY_ESCAPE.sub(lambda m: _COPY_CHARS[m[1]], field)
        for field in row[:-1].split("\t")
    ]


def expected_fields(number: int, line: str, defaults: dict[str, Any] | None) -> list[Any]:
    """What make_job makes of a line, as the row's fields read back."""
    job = job_from_record(json.loads(line), defaults)
    run_at = None if job.run_at is None else str(job.run_at)
    return [
        str(number),
        job.kind,
        json.loads(job.payload),
        job.queue,
        str(job.priority),
        str(job.max_attempts),
        run_at,
        job.delay,
        job.unique_key,
    ]


def read_back(row: str) -> list[Any]:
    fields = copy_fields(row)
    assert len(fields) == 9
    payload, delay = fields[2], fields[7]
    assert payload is not None and delay is not None
    return [*fields[:2], json.loads(payload), *fields[3:7], float(delay), fields[8]]


@pytest.mark.parametrize("defaults", DEFAULTS)
@pytest.mark.parametrize("line", COMMON + GENERAL)
def test_a_row_holds_what_make_job_makes_of_its_line(
    line: str, defaults: dict[str, Any] | None
) -> None:
    (row,) = read_rows([b"\n", line.encode() + b"\n"], defaults=defaults)
    assert read_back(row) == expected_fields(2, line.strip(), defaults)


@pytest.mark.parametrize("line", COMMON)
def test_common_lines_are_checked_inline(line: str) -> None:
    fast = ENQUEUE._simple_defaults(None)
    assert ENQUEUE._simple_line_row(1, line, fast) is not None


@pytest.mark.parametrize("line", GENERAL)
def test_other_lines_go_through_make_job(line: str) -> None:
    fast = ENQUEUE._simple_defaults(None)
    assert ENQUEUE._simple_line_row(1, line, fast) is None


def test_a_payload_goes_as_written_when_it_can_be_cut_out_whole() -> None:
    as_written = ENQUEUE._payload_as_written
    assert as_written('{"kind": "a", "payload": {"x": 1.50} }') == ' {"x": 1.50} '
    assert as_written('{"payload": {"x": 1}, "kind": "a"}') is None
    assert as_written('{"kind": "a", "payload": {"payload": 1}}') is None


def test_bad_defaults_are_reported_on_each_line_that_uses_them() -> None:
    rows = read_rows([b'{"kind": "a", "delay": 5}', b'{"kind": "b"}'], defaults={"queue": ""})
    with pytest.raises(BadInput, match="line 1: queue must not be empty"):
        next(rows)


ODD = 'tab\there, line\nbreak, cr\r, back\\slash \\N, quote " and café 😀'
# Jobs as Python callers give them, in the common shape.
COMMON_RECORDS: list[dict[str, Any]] = [
    {"kind": "echo", "payload": {"argv": ["echo", "job 1"]}},
    {"kind": "a"},
    {"kind": ODD, "queue": ODD, "payload": {ODD: [ODD, 1.5, None, True]}},
    {"kind": "a", "payload": None, "queue": None, "priority": None, "max_attempts": None},
    {"kind": "a", "queue": "q", "priority": -(2**31), "max_attempts": 2**31 - 1},
]
# Jobs that make_job checks: its own timing, something it refuses, or text
# that looks like an escaped NUL.
OTHER_RECORDS: list[Any] = [
    {"kind": "a", "payload": {"path": "C:\\u0000"}},
    {"kind": "a", "delay": 5},
    {"kind": "a", "run_at": "2030-01-01T00:00:00Z"},
    {"kind": "a\x00"},
    {"kind": "a", "queue": "\ud800"},
    {"kind": "a", "payload": {"x": "a\x00b"}},
    {"kind": "a", "payload": {"\ud800": 1}},
    {"kind": "a", "payload": {"x": float("nan")}},
    {"kind": "a", "payload": {"t": dt.date(2030, 1, 1)}},
    {"kind": "a", "priority": True},
    {"kind": "a", "max_attempts": 0},
    {"kind": ""},
    {"payload": {}},
    {"kind": "a", "payload": [1]},
    [("kind", "a")],
]


@pytest.mark.parametrize("defaults", DEFAULTS)
@pytest.mark.parametrize("record", COMMON_RECORDS)
def test_a_record_row_holds_what_make_job_makes_of_it(
    record: dict[str, Any], defaults: dict[str, Any] | None
) -> None:
    fast = ENQUEUE._simple_defaults(defaults)
    row = ENQUEUE._simple_record_row(3, record, fast)
    assert row is not None
    assert read_back(row) == expected_record_fields(3, record, defaults)


@pytest.mark.parametrize("record", OTHER_RECORDS)
def test_other_records_go_through_make_job(record: Any) -> None:
    fast = ENQUEUE._simple_defaults(None)
    assert ENQUEUE._simple_record_row(1, record, fast) is None


def expected_record_fields(number: int, record: Any, defaults: dict[str, Any] | None) -> list[Any]:
    return expected_fields(number, ENQUEUE._encode(record), defaults)


def general_path(number: int, line: str, defaults: dict[str, Any] | None) -> list[Any] | str:
    """What make_job makes of a line: its row read back, or its error."""
    try:
        record = ENQUEUE._decode_text(line)
        return read_back(ENQUEUE._job_row(number, job_from_record(record, defaults)))
    except BadInput as exc:
        return str(exc)


def random_lines(seed: int, count: int) -> list[str]:
    """Job lines made of the pieces the quick path must not be fooled by."""
    rnd = random.Random(seed)
    pieces = ["payload", "kind", '"', "\\", "\t", "\n", "\x00", "\\u0000", "é", "😀", "}", ":", "a"]
    numbers = [0, -0.0, 1.5, 1e-400, 1e400, 5e-324, 2**31, -(2**31), 3, True, None, 10**25]

    def text() -> str:
        return "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 4)))

    def value(depth: int) -> Any:
        choice = rnd.random()
        if depth > 2 or choice < 0.3:
            return rnd.choice(numbers)
        if choice < 0.6:
            return text()
        if choice < 0.8:
            return [value(depth + 1) for _ in range(rnd.randint(0, 3))]
        return {text(): value(depth + 1) for _ in range(rnd.randint(0, 3))}

    fields = {
        "kind": lambda: rnd.choice(["k", "payload", text(), 1, None]),
        "payload": lambda: rnd.choice([{}, {text(): value(1)}, {"payload": value(1)}, value(1)]),
        "queue": lambda: rnd.choice(["q", text(), None, 5]),
        "priority": lambda: rnd.choice(numbers),
        "max_attempts": lambda: rnd.choice(numbers),
        "delay": lambda: rnd.choice([5, "5m", None]),
        "extra": lambda: 1,
    }
    lines = []
    for _ in range(count):
        keys = rnd.sample(sorted(fields), rnd.randint(1, 4))
        record = {"kind": "k", **{key: fields[key]() for key in keys}}
        separators = rnd.choice([(",", ":"), (", ", ": ")])
        ascii_only = rnd.random() < 0.3
        lines.append(json.dumps(record, ensure_ascii=ascii_only, separators=separators))
    return lines


@pytest.mark.parametrize("defaults", DEFAULTS)
def test_random_lines_are_read_as_make_job_reads_them(defaults: dict[str, Any] | None) -> None:
    for line in random_lines(seed=len(str(defaults)), count=3000):
        try:
            (row,) = read_rows([line.encode("utf-8", "surrogatepass")], defaults=defaults)
            got: list[Any] | str = read_back(row)
        except BadInput as exc:
            got = str(exc).removeprefix("input, line 1: ")
        if any("\ud800" <= c <= "\udfff" for c in line):  # json.dumps let a lone one through
            assert isinstance(got, str) and "not valid UTF-8" in got
        else:
            assert got == general_path(1, line, defaults), line


def test_random_records_are_checked_as_make_job_checks_them() -> None:
    fast = ENQUEUE._simple_defaults(None)
    for line in random_lines(seed=7, count=3000):
        record = json.loads(line)
        row = ENQUEUE._simple_record_row(1, record, fast)
        if row is not None:
            assert read_back(row) == read_back(ENQUEUE._job_row(1, job_from_record(record)))
