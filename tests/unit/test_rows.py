"""What a row may hold, read safely: the depth guard, a claimed payload's
checks, and what a read command keeps of a payload and a last_error."""

from __future__ import annotations

import json

import pytest

from pgqctl import limits, rows
from pgqctl.errors import BadInput
from pgqctl.limits import nested_deeper_than
from pgqctl.rows import Unreadable, claimed_payload


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("text", "depth", "deeper"),
    [
        (nested(3), 3, False),
        (nested(4), 3, True),
        # Many brackets side by side nest one level.
        ("[" + ",".join(["[]"] * 1000) + "]", 2, False),
        # Brackets inside strings do not nest, escaped quotes do not end one.
        (json.dumps({"s": "[[[[[[", "t": '\\"[[[[[['}), 1, False),
        (json.dumps({"s": '"', "a": [[[1]]]}), 3, True),
        # Many brackets, all in a string.
        (json.dumps("[" * 1000), 3, False),
        (json.dumps({"s": "[" * 1000}), 1, False),
    ],
)
def test_nesting_is_counted_outside_strings(text: str, depth: int, deeper: bool) -> None:
    assert nested_deeper_than(text, depth) is deeper


def test_a_payload_deeper_than_python_can_decode_is_refused_not_raised() -> None:
    value, why = rows.decode(nested(5000))
    assert value is None
    assert why == "nested more than 256 levels deep"
    assert rows.decode(nested(256)) == (json.loads(nested(256)), None)


def claimed(text: str, kind: str = "k", queue: str = "q", max_bytes: int = 1000) -> object:
    return claimed_payload(text, kind=kind, queue=queue, max_bytes=max_bytes)


def test_a_claimed_payload_within_every_limit_is_its_value() -> None:
    assert claimed('{"argv": ["true"]}') == {"argv": ["true"]}


@pytest.mark.parametrize(
    ("text", "kind", "queue", "reason"),
    [
        ('{"a": "' + "x" * 1000 + '"}', "k", "q", "payload is over the worker's limit of 1,000"),
        # 409 characters, 1,209 bytes.
        ('{"a": "' + "€" * 400 + '"}', "k", "q", "payload is over the worker's limit of 1,000"),
        ('{"a": ' + nested(300) + "}", "k", "q", "payload is nested more than 256"),
        ("[1]", "k", "q", "payload is an array, not an object"),
        ('"s"', "k", "q", "payload is a JSON string, not an object"),
        ("4.5", "k", "q", "payload is a JSON number, not an object"),
        ("null", "k", "q", "payload is a JSON null, not an object"),
        ("true", "k", "q", "payload is a JSON boolean, not an object"),
        ("{}", "a\nb", "q", 'kind "a\\nb" holds the control character \\x0a at character 2'),
        ("{}", "k", "q\x1b", 'queue "q\\u001b" holds the control character \\x1b at'),
        # Printable to no one: invisible, or reordering what follows.
        ("{}", "a\xa0b", "q", 'kind "a\\u00a0b" holds the unprintable character U+00A0'),
        ("{}", "k", "\u200bq", 'queue "\\u200bq" holds the unprintable character U+200B'),
        ("{}", "a\u2028", "q", 'kind "a\\u2028" holds the unprintable character U+2028'),
        ("{}", "\u202eevil", "q", 'kind "\\u202eevil" holds the unprintable character U+202E'),
    ],
)
def test_a_claimed_job_that_can_never_run_says_why(
    text: str, kind: str, queue: str, reason: str
) -> None:
    found = claimed(text, kind, queue)
    assert isinstance(found, Unreadable)
    assert found.reason.startswith(reason)


# Every character of the Basic and Supplementary Multilingual planes, and
# the tags: a name holding one is refused by enqueue exactly when a worker
# would fail its job (issue 22: what enqueue accepts, a worker runs).
CHARACTERS = [chr(c) for c in (*range(0x20000), *range(0xE0000, 0xE0080))]


def test_enqueue_refuses_a_name_exactly_when_a_worker_would_fail_its_job() -> None:
    for what in ("kind", "queue"):
        differ = []
        for c in CHARACTERS:
            name = f"a{c}b"
            try:
                limits.check_name(what, name)
                refused = False
            except BadInput:
                refused = True
            names = {"kind": "k", "queue": "q", what: name}
            failed = isinstance(claimed("{}", names["kind"], names["queue"]), Unreadable)
            if refused != failed:
                differ.append(c)
        assert differ == [], what


def row(payload: str, error: str | None = None) -> dict[str, object]:
    return {"payload_head": payload, "last_error_head": error}


def test_a_row_within_the_bounds_is_shown_whole_and_decoded() -> None:
    shown = rows.shown(row('{"a": 1}', "boom"))
    assert shown == rows.Shown({"a": 1}, None, False, "boom", False)


def test_a_payload_and_an_error_over_the_bounds_are_cut_and_said_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rows, "SHOWN_PAYLOAD_CHARS", 10)
    monkeypatch.setattr(rows, "SHOWN_ERROR_CHARS", 3)
    # The SQL reads one character more than is kept: that one says it is cut.
    shown = rows.shown(row('{"a": "xxxxxxxxx"}'[:11], "boom"))
    assert shown == rows.Shown(
        '{"a": "xxx', "cut: the first 10 characters of its JSON text", True, "boo", True
    )


def test_a_payload_too_deep_is_shown_as_its_text() -> None:
    shown = rows.shown(row(nested(300)))
    assert shown.payload == nested(300)
    assert shown.payload_note == "nested more than 256 levels deep: its JSON text"
    assert shown.payload_cut is False
