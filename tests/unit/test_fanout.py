"""One job per kind: the rows of a line or record with "kinds", whichever way it
is read, and how they are numbered and keyed."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from pgqctl.errors import BadInput
from pgqctl.intake import copy_rows, lines
from pgqctl.intake.fanout import fan_out, record_number, row_number
from pgqctl.intake.fields import jobs_from_record, make_job
from pgqctl.intake.lines import read_rows
from pgqctl.limits import MAX_KINDS
from tests.unit.test_enqueue_rows import COMMON, DEFAULTS, GENERAL, read_back


def with_kinds(line: str, *others: str) -> dict[str, Any]:
    """The record of a line, its "kind" turned into "kinds" with `others` after it."""
    record = json.loads(line)
    record["kinds"] = [record.pop("kind"), *others]
    return record


@pytest.mark.parametrize("defaults", DEFAULTS)
@pytest.mark.parametrize("line", COMMON + GENERAL)
def test_a_kinds_line_gives_one_row_per_kind_as_the_field_checks_make_them(
    line: str, defaults: dict[str, Any] | None
) -> None:
    record = with_kinds(line, "second", "third")
    text = json.dumps(record, ensure_ascii=False)
    rows = list(read_rows([b'{"kind": "first"}\n', text.encode() + b"\n"], defaults=defaults))
    assert len(rows) == 4
    jobs = jobs_from_record(record, defaults)
    assert [job.kind for job in jobs] == [*record["kinds"]]
    expected = [copy_rows.job_row(row_number(2, i), job) for i, job in enumerate(jobs)]
    assert [read_back(r) for r in rows[1:]] == [read_back(r) for r in expected]
    assert [r.split("\t")[0] for r in rows] == ["1", "2", "2.001", "2.002"]
    # The quick checks leave such a line, and such a record, to the field checks.
    fast = lines.simple_defaults(defaults)
    assert lines.simple_line_row(2, text, fast) is None
    assert lines.simple_record_row(2, record, fast) is None


@pytest.mark.parametrize(
    "record",
    [
        {"kind": "a", "kinds": ["b"]},
        {"kind": "a", "kinds": []},
        {"kinds": ["a"], "kind": "a", "payload": {}},
    ],
)
def test_kind_and_kinds_together_are_refused_on_every_path(record: dict[str, Any]) -> None:
    with pytest.raises(BadInput, match='give "kind" or "kinds", not both'):
        jobs_from_record(record)
    with pytest.raises(BadInput, match='line 1: give "kind" or "kinds", not both'):
        list(read_rows([json.dumps(record).encode()]))


def test_null_kinds_is_absent_as_every_null_is() -> None:
    (row,) = read_rows([b'{"kind": "a", "kinds": null}'])
    assert row.split("\t")[:2] == ["1", "a"]
    assert jobs_from_record({"kind": "a", "kinds": None}) == [make_job("a")]


def test_row_numbers_sort_in_the_order_of_records_then_kinds() -> None:
    numbers = [row_number(n, i) for n in (1, 9, 10, 11) for i in range(MAX_KINDS)]
    assert sorted(numbers, key=lambda n: Decimal(str(n))) == numbers
    assert {record_number(str(n)) for n in numbers} == {1, 9, 10, 11}


def test_each_kind_gets_its_own_key() -> None:
    job = make_job("a", {"n": 1}, queue="q", unique_key="order:42")
    jobs = fan_out(job, ["a", "b"])
    assert [(j.kind, j.unique_key, j.payload, j.queue) for j in jobs] == [
        ("a", "a:order:42", '{"n":1}', "q"),
        ("b", "b:order:42", '{"n":1}', "q"),
    ]
    assert [j.unique_key for j in fan_out(make_job("a"), ["a", "b"])] == [None, None]
