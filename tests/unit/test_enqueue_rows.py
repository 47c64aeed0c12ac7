"""The COPY rows a bulk load sends: one per job, the same whichever way a line is checked."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import random
import re
from typing import Any

import pytest

from pgqctl.errors import BadInput
from pgqctl.intake import copy_rows, fields, lines
from pgqctl.intake.fields import job_from_record, jobs_from_record
from pgqctl.intake.lines import read_rows

# Lines in the shape most bulk files have: checked inline, without make_job.
COMMON = [
    '{"kind": "echo", "payload": {"argv": ["echo", "job 1"]}}',
    '{"kind":"a","payload":{"x":1}}',
    '{"payload": {"x": 1}, "kind": "a"}',
    '{"kind": "a", "payload": {"payload": {"y": 2}}}',
    '{"kind": "payload", "payload": {"kind": "payload"}}',
    '{"kind": "a", "payload": {"s": "tab\\there \\"q\\" back\\\\slash\\nline\\r"}}',
    '{"kind": "a\\\\b\\/c", "queue": "q\\\\n", "payload": {}}',
    '{"kind": "\\\\N"}',
    '{"kind": "' + "k" * 128 + '", "queue": "' + "😀" * 128 + '"}',  # names at their limit
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
    '{"kind": "a", "unique_key": "user:7 \\\\N", "payload": {"x": 1}}',
    # Keys that are not printable but hold no control character: a key comes
    # from a job's data, and no worker refuses one.
    '{"kind": "a", "unique_key": "u\u00a0v\u2028"}',
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
    fast = lines.simple_defaults(None)
    assert lines.simple_line_row(1, line, fast) is not None


@pytest.mark.parametrize("line", GENERAL)
def test_other_lines_go_through_make_job(line: str) -> None:
    fast = lines.simple_defaults(None)
    assert lines.simple_line_row(1, line, fast) is None


def test_a_payload_goes_as_written_when_it_can_be_cut_out_whole() -> None:
    as_written = lines._payload_as_written
    assert as_written('{"kind": "a", "payload": {"x": 1.50} }') == ' {"x": 1.50} '
    assert as_written('{"payload": {"x": 1}, "kind": "a"}') is None
    assert as_written('{"kind": "a", "payload": {"payload": 1}}') is None


def test_bad_defaults_are_reported_on_each_line_that_uses_them() -> None:
    rows = read_rows([b'{"kind": "a", "delay": 5}', b'{"kind": "b"}'], defaults={"queue": ""})
    with pytest.raises(BadInput, match="line 1: queue must not be empty"):
        next(rows)


ODD = 'tab\there, line\nbreak, cr\r, back\\slash \\N, quote " and café 😀'
ODD_NAME = 'back\\slash \\N, quote " and café 😀'  # names hold no control character
# Jobs as Python callers give them, in the common shape.
COMMON_RECORDS: list[dict[str, Any]] = [
    {"kind": "echo", "payload": {"argv": ["echo", "job 1"]}},
    {"kind": "a"},
    {"kind": ODD_NAME, "queue": ODD_NAME, "payload": {ODD: [ODD, 1.5, None, True]}},
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
    fast = lines.simple_defaults(defaults)
    row = lines.simple_record_row(3, record, fast)
    assert row is not None
    assert read_back(row) == expected_record_fields(3, record, defaults)


@pytest.mark.parametrize("record", OTHER_RECORDS)
def test_other_records_go_through_make_job(record: Any) -> None:
    fast = lines.simple_defaults(None)
    assert lines.simple_record_row(1, record, fast) is None


def expected_record_fields(number: int, record: Any, defaults: dict[str, Any] | None) -> list[Any]:
    return expected_fields(number, fields.encode(record), defaults)


def general_path(
    number: int, line: str, defaults: dict[str, Any] | None, max_payload_bytes: int = 2**20
) -> list[Any] | str:
    """What make_job makes of a line: its row read back, or its error."""
    try:
        record = lines.decode_line(line)
        job = job_from_record(record, defaults, max_payload_bytes=max_payload_bytes)
        return read_back(copy_rows.job_row(number, job))
    except BadInput as exc:
        return str(exc)


def random_lines(seed: int, count: int) -> list[str]:
    """Job lines made of the pieces the quick path must not be fooled by."""
    rnd = random.Random(seed)
    pieces = ["payload", "kind", '"', "\\", "\t", "\n", "\x00", "\\u0000", "é", "😀", "}", ":", "a"]
    pieces += ["\x7f", "\x85", "\u00a0", "\u200b", "\u202e", "1e15", "k" * 60]
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


@pytest.mark.parametrize("max_payload_bytes", [2**20, 40])  # 40: the limit is met often
@pytest.mark.parametrize("defaults", DEFAULTS)
def test_random_lines_are_read_as_make_job_reads_them(
    defaults: dict[str, Any] | None, max_payload_bytes: int
) -> None:
    for line in random_lines(seed=len(str(defaults)), count=3000):
        try:
            (row,) = read_rows(
                [line.encode("utf-8", "surrogatepass")],
                defaults=defaults,
                max_payload_bytes=max_payload_bytes,
            )
            got: list[Any] | str = read_back(row)
        except BadInput as exc:
            got = str(exc).removeprefix("input, line 1: ")
        if any("\ud800" <= c <= "\udfff" for c in line):  # json.dumps let a lone one through
            assert isinstance(got, str) and "not valid UTF-8" in got
        else:
            assert got == general_path(1, line, defaults, max_payload_bytes), line


@pytest.mark.parametrize("max_payload_bytes", [2**20, 40])
def test_random_records_are_checked_as_make_job_checks_them(max_payload_bytes: int) -> None:
    fast = lines.simple_defaults(None, max_payload_bytes)
    for line in random_lines(seed=7, count=3000):
        record = json.loads(line)
        row = lines.simple_record_row(1, record, fast)
        if row is not None:
            job = job_from_record(record, max_payload_bytes=max_payload_bytes)
            assert read_back(row) == read_back(copy_rows.job_row(1, job))


# Jobs over a limit, or with a control character in a name, as a line and as
# the record it holds; each is refused on both paths with the same reason.
# "\\u..." escapes in a line go through make_job anyway: these are written raw.
def nested(levels: int) -> dict[str, Any]:
    """A payload of `levels` objects, each in the one before."""
    payload: dict[str, Any] = {}
    for _ in range(levels - 1):
        payload = {"a": payload}
    return payload


REFUSED = [
    ({"kind": "k" * 129}, "kind is 129 characters long: the limit is 128 characters"),
    ({"kind": "k", "queue": "😀" * 129}, "queue is 129 characters long: the limit is 128"),
    ({"kind": "k", "unique_key": "u" * 257}, "unique_key is 257 characters long: the limit is 256"),
    ({"kind": "a\tb"}, r"kind holds the control character \\x09 at character 2"),
    ({"kind": "k", "queue": "evil\nCRITICAL"}, r"queue holds the control character \\x0a at"),
    ({"kind": "k", "queue": "q\x7f"}, r"queue holds the control character \\x7f at character 2"),
    ({"kind": "\x85k"}, r"kind holds the control character \\x85 at character 1"),
    ({"kind": "k", "unique_key": "\x1b[31m"}, r"unique_key holds the control character \\x1b"),
    # Names a worker would refuse (what is not printable): refused before they are stored.
    ({"kind": "a\u00a0b"}, r"kind holds the unprintable character U\+00A0 \(NO-BREAK SPACE\) at"),
    ({"kind": "k", "queue": "q\u2028"}, r"queue holds the unprintable character U\+2028 \(LINE"),
    ({"kind": "\u202eevil"}, r"kind holds the unprintable character U\+202E \(RIGHT-TO-LEFT"),
    ({"kind": "zero\u200bwidth"}, r"kind holds the unprintable character U\+200B .* character 5"),
    (
        {"kind": "k", "payload": {"x": "y" * 40}},
        "payload is 48 bytes as JSON: the limit is 47 bytes",
    ),
    # As written, the payload is 9 bytes; as make_job measures it, 24.
    ({"kind": "k", "payload": {"x": 1e15}}, "payload is 24 bytes as JSON: the limit is 23"),
    # Workers refuse what they could not walk: refused before it is stored.
    ({"kind": "k", "payload": nested(257)}, "payload nests arrays and objects more than 256"),
]


def _limit_of(message: str) -> int:
    return 47 if "is 47 bytes" in message else 23 if "is 23" in message else 2**20


@pytest.mark.parametrize(("record", "message"), REFUSED)
def test_limits_and_control_characters_are_refused_on_both_paths(
    record: dict[str, Any], message: str
) -> None:
    limit = _limit_of(message)
    line = json.dumps(record, ensure_ascii=False).replace('"x": 1000000000000000.0', '"x": 1e15')
    with pytest.raises(BadInput, match=f"^input, line 1: {message}"):
        list(read_rows([line.encode()], max_payload_bytes=limit))
    fast = lines.simple_defaults(None, limit)
    assert lines.simple_record_row(1, record, fast) is None
    with pytest.raises(BadInput, match=f"^{message}"):
        job_from_record(record, max_payload_bytes=limit)


def test_a_payload_nested_to_the_limit_is_taken_on_both_paths() -> None:
    record = {"kind": "k", "payload": nested(256)}
    (row,) = read_rows([json.dumps(record).encode()])
    assert read_back(row)[2] == record["payload"]
    assert job_from_record(record).payload == json.dumps(record["payload"], separators=(",", ":"))


def test_a_payload_at_the_limit_is_taken_from_a_line_and_from_a_record() -> None:
    record = {"kind": "k", "payload": {"x": "y" * 40}}  # 48 bytes as JSON
    line = json.dumps(record).encode()
    (row,) = read_rows([line], max_payload_bytes=48)
    assert read_back(row)[2] == record["payload"]
    fast = lines.simple_defaults(None, 48)
    assert lines.simple_record_row(1, record, fast) is not None


# Bad lines, each fed to the quick checks and to the field checks: both
# refuse it, with the same message (or the quick checks leave it to the
# field checks). The record a line holds goes through both paths too.
BAD_LINES = [
    '{"kind": 5}',
    '{"kind": ""}',
    '{"kind": "   "}',
    '{"kind": null}',
    '{"payload": {}}',
    '{"kind": ["a"]}',
    '{"kind": "' + "k" * 129 + '"}',
    '{"kind": "a\x7fb"}',
    '{"kind": "\x85"}',
    '{"kind": "a\\tb"}',
    '{"kind": "k", "payload": []}',
    '{"kind": "k", "payload": "x"}',
    '{"kind": "k", "payload": 5}',
    '{"kind": "k", "payload": true}',
    '{"kind": "k", "payload": {"x": NaN}}',
    '{"kind": "k", "payload": {"x": 1e400}}',
    '{"kind": "k", "payload": {"s": "\\u0000"}}',
    '{"kind": "k", "payload": {"argv": "ls"}}',
    '{"kind": "k", "payload": {"argv": ["ls"], "timout": 1}}',
    '{"kind": "k", "payload": {"argv": ["ls"], "timeout": 1e308}}',
    '{"kind": "k", "payload": {"argv": ["ls"], "timeout": 3153600001}}',
    '{"kind": "k", "payload": {"shell": 5}}',
    '{"kind": "k", "priority": "high"}',
    '{"kind": "k", "priority": 1.5}',
    '{"kind": "k", "priority": true}',
    '{"kind": "k", "priority": 2147483648}',
    '{"kind": "k", "priority": -2147483649}',
    '{"kind": "k", "max_attempts": 0}',
    '{"kind": "k", "max_attempts": "3"}',
    '{"kind": "k", "max_attempts": 2147483648}',
    '{"kind": "k", "delay": -1}',
    '{"kind": "k", "delay": "soon"}',
    '{"kind": "k", "delay": true}',
    '{"kind": "k", "delay": 1e12}',
    '{"kind": "k", "run_at": "tomorrow"}',
    '{"kind": "k", "run_at": 5}',
    '{"kind": "k", "run_at": "99999-01-01T00:00:00"}',
    '{"kind": "k", "run_at": "2030-01-01T00:00:00Z", "delay": 5}',
    '{"kind": "k", "colour": "red"}',
    '{"kind": "k", "kinds": ["a"]}',
    '{"kinds": []}',
    '{"kinds": "a"}',
    '{"kinds": ["a", "a"]}',
    '{"kinds": ["a", 5]}',
    '{"kind": "k", "queue": ""}',
    '{"kind": "k", "queue": 7}',
    '{"kind": "k", "queue": "a\\nb"}',
    '{"kind": "k", "queue": "' + "q" * 129 + '"}',
    '{"kind": "k", "unique_key": 7}',
    '{"kind": "k", "unique_key": "' + "u" * 257 + '"}',
    '{"kind": "k", "unique_key": "a\\u001bb"}',
    '{"kind": "k", "priority": []}',
    "[1, 2]",
    '"kind"',
    '{"kind": "k"',
    '{"kind": "k"} {"kind": "j"}',
    '{"kind": "a\x01b"}',
    '{"kind": "a\u200bb"}',
    '{"kind": "k", "queue": "q\\u202e"}',
]


def field_checks(line: str, defaults: dict[str, Any] | None) -> list[list[Any]] | str:
    """What the field checks alone make of a line: its rows read back, or their error."""
    try:
        record = lines.decode_line(line)
        jobs = jobs_from_record(record, defaults)
    except BadInput as exc:
        return str(exc)
    return [read_back(copy_rows.job_row(1, job)) for job in jobs]


def quick_checks(line: str, defaults: dict[str, Any] | None) -> list[list[Any]] | str | None:
    """What the quick checks alone make of a line; None: they leave it to the field checks."""
    try:
        row = lines.simple_line_row(1, line, lines.simple_defaults(defaults))
    except BadInput as exc:
        return str(exc)
    return None if row is None else [read_back(row)]


def quick_record_checks(record: Any) -> list[list[Any]] | str | None:
    """What the quick checks of enqueue_many make of a record (see quick_checks)."""
    try:
        row = lines.simple_record_row(1, record, lines.simple_defaults(None))
    except BadInput as exc:
        return str(exc)
    return None if row is None else [read_back(row)]


def record_field_checks(record: Any) -> list[list[Any]] | str:
    try:
        jobs = jobs_from_record(record)
    except BadInput as exc:
        return str(exc)
    return [read_back(copy_rows.job_row(1, job)) for job in jobs]


def test_there_are_enough_bad_lines() -> None:
    assert len(BAD_LINES) >= 30
    assert len(set(BAD_LINES)) == len(BAD_LINES)


@pytest.mark.parametrize("defaults", DEFAULTS)
@pytest.mark.parametrize("line", BAD_LINES)
def test_bad_lines_are_refused_alike_by_the_quick_and_the_field_checks(
    line: str, defaults: dict[str, Any] | None
) -> None:
    expected = field_checks(line, defaults)
    assert isinstance(expected, str), f"the field checks take {line!r}"
    assert quick_checks(line, defaults) in (None, expected)
    with pytest.raises(BadInput) as refused:
        list(read_rows([line.encode()], defaults=defaults))
    assert str(refused.value) == f"input, line 1: {expected}"


def _json_values(texts: list[str]) -> list[Any]:
    values = []
    for text in texts:
        with contextlib.suppress(ValueError):  # not JSON: no record to give enqueue_many
            values.append(json.loads(text))
    return values


@pytest.mark.parametrize("record", _json_values(BAD_LINES))
def test_bad_records_are_refused_alike_by_the_quick_and_the_field_checks(record: Any) -> None:
    expected = record_field_checks(record)
    assert isinstance(expected, str), f"the field checks take {record!r}"
    assert quick_record_checks(record) in (None, expected)


@pytest.mark.parametrize("defaults", DEFAULTS)
@pytest.mark.parametrize("line", COMMON + GENERAL)
def test_good_lines_are_taken_alike_by_the_quick_and_the_field_checks(
    line: str, defaults: dict[str, Any] | None
) -> None:
    expected = field_checks(line.strip(), defaults)
    assert not isinstance(expected, str), expected
    assert quick_checks(line.strip(), defaults) in (None, expected)
    record = json.loads(line)
    assert quick_record_checks(record) in (None, record_field_checks(record))
