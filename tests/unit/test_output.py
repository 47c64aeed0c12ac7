"""Every output format, as a script or a person would read it."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest

from pgqctl.fartime import FarTime
from pgqctl.output.formats import emit_ids, emit_object, emit_record, emit_rows, resolve_format
from pgqctl.text import format_seconds, shell_word

ROWS = [
    {
        "id": 1,
        "kind": "email",
        "payload": {"to": "a@b"},
        "run_at": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc),
        "last_error": None,
    },
    {"id": 2, "kind": "[bold]x[/bold]", "payload": {}, "run_at": None, "last_error": "boom"},
]


def render(fmt: str) -> str:
    out = io.StringIO()
    emit_rows(ROWS, ["id", "kind"], fmt, stream=out)
    return out.getvalue()


def test_json_carries_every_field_with_iso_timestamps() -> None:
    data = json.loads(render("json"))
    assert data[0] == {
        "id": 1,
        "kind": "email",
        "payload": {"to": "a@b"},
        "run_at": "2026-01-02T03:04:05+00:00",
        "last_error": None,
    }


def test_ndjson_is_one_object_per_line() -> None:
    lines = render("ndjson").splitlines()
    assert [json.loads(line)["id"] for line in lines] == [1, 2]


def test_csv_and_tsv_have_a_header_and_json_cells() -> None:
    csv_lines = render("csv").splitlines()
    assert csv_lines[0] == "id,kind,payload,run_at,last_error"
    assert csv_lines[1] == '1,email,"{""to"":""a@b""}",2026-01-02T03:04:05+00:00,'
    assert render("tsv").splitlines()[2].split("\t")[:2] == ["2", "[bold]x[/bold]"]


def test_plain_shows_chosen_columns_only() -> None:
    lines = render("plain").splitlines()
    assert lines[0].split() == ["id", "kind"]
    assert lines[2].split() == ["1", "email"]


def test_rich_table_does_not_interpret_markup_in_data() -> None:
    assert "[bold]x[/bold]" in render("table")


def test_auto_is_plain_when_not_a_terminal() -> None:
    assert resolve_format("auto", io.StringIO()) == "plain"


def test_empty_listing_prints_no_table_but_valid_json() -> None:
    out = io.StringIO()
    emit_rows([], ["id"], "plain", stream=out)
    assert out.getvalue() == ""
    emit_rows([], ["id"], "json", stream=out)
    assert json.loads(out.getvalue()) == []


def test_emit_object_and_durations() -> None:
    out = io.StringIO()
    emit_object({"age": dt.timedelta(seconds=90)}, out)
    assert json.loads(out.getvalue()) == {"age": 90.0}
    assert format_seconds(-75) == "-1m15s"
    assert format_seconds(7380) == "2h03m"


@pytest.mark.parametrize("fmt", ["json", "ndjson", "csv", "tsv", "plain", "table"])
@pytest.mark.parametrize("ids", [[], [7], [1, 2, 30]])
def test_ids_read_as_the_records_they_stand_for(fmt: str, ids: list[int]) -> None:
    fast, rows = io.StringIO(), io.StringIO()
    emit_ids(ids, fmt, stream=fast)
    emit_rows([{"id": i} for i in ids], ["id"], fmt, stream=rows)
    assert fast.getvalue() == rows.getvalue()


def test_tables_show_control_characters_escaped_but_keep_lines() -> None:
    stream = io.StringIO()
    rows = [{"kind": "k\x01\x1b[31mred", "error": "line one\nline two\r\x9b"}]
    emit_rows(rows, ["kind", "error"], "plain", stream=stream)
    text = stream.getvalue()
    assert "\x1b" not in text and "\r" not in text and "\x9b" not in text
    assert "k\\x01\\x1b[31mred" in text
    assert "line one\n" in text and "line two\\x0d\\x9b" in text


def test_characters_that_hide_or_reorder_text_are_shown_escaped() -> None:
    # What a name may not hold (limits.unprintable): a no-break and a
    # zero-width space, a line separator, a bidi override, a tag.
    stream = io.StringIO()
    rows = [{"kind": "a\xa0b", "error": "zero\u200bwidth\u2028\u202eevil\U000e0001 café 😀"}]
    emit_rows(rows, ["kind", "error"], "plain", stream=stream)
    text = stream.getvalue()
    assert "a\\xa0b" in text
    assert "zero\\u200bwidth\\u2028\\u202eevil\\U000e0001 café 😀" in text
    assert shell_word("q\u202e x") == "$'q\\u202e x'"  # as bash's $'...' reads it


def test_a_time_no_datetime_holds_is_shown_as_postgresql_writes_it() -> None:
    never = FarTime("infinity")
    assert never > dt.datetime(9999, 1, 1, tzinfo=dt.timezone.utc) > FarTime("-infinity")
    rows = [{"id": 1, "run_at": never, "created_at": FarTime("10001-01-01 00:00:00+00")}]
    stream = io.StringIO()
    emit_rows(rows, ["id", "run_at", "created_at"], "plain", stream=stream)
    assert "infinity" in stream.getvalue() and "10001-01-01 00:00:00+00" in stream.getvalue()
    stream = io.StringIO()
    emit_rows(rows, ["id"], "json", stream=stream)
    assert json.loads(stream.getvalue())[0]["run_at"] == "infinity"
    assert f"{never.astimezone(dt.timezone(dt.timedelta(hours=5))):%m-%d %H:%MZ}" == "infinity"


@pytest.mark.parametrize("fmt", ["plain", "table"])
def test_a_name_with_a_newline_stays_on_its_rows_line(fmt: str) -> None:
    stream = io.StringIO()
    rows = [
        {"id": 1, "queue": "evil\nCRITICAL fake", "kind": "k\tx", "status": "pending"},
        {"id": 2, "queue": "default", "kind": "k", "status": "pending"},
    ]
    # Piped (no width) and on a terminal of 120 columns.
    emit_rows(rows, ["id", "queue", "kind", "status"], fmt, stream=stream, width=None)
    lines = stream.getvalue().splitlines()
    assert not any(line.lstrip().startswith("CRITICAL") for line in lines)
    assert [line.split()[0] for line in lines if line.split()[0] in ("1", "2")] == ["1", "2"]
    assert any("evil\\x0aCRITICAL fake" in line and "k\\x09x" in line for line in lines)


def test_show_keeps_the_lines_of_payload_and_error_and_makes_names_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    emit_record(
        {"id": 1, "queue": "evil\nCRITICAL fake", "payload": "{\n  1\n}", "last_error": "a\nb"},
        "plain",
    )
    lines = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    assert lines[2:] == [
        "id 1",
        "queue evil\\x0aCRITICAL fake",
        "payload {",
        "1",
        "}",
        "last_error a",
        "b",
    ]


def test_tsv_is_one_line_per_record_with_escapes_not_quotes() -> None:
    stream = io.StringIO()
    rows = [
        {"id": 1, "last_error": 'exit 1\nboom\tat C:\\tmp "x"\r'},
        {"id": 2, "last_error": None},
    ]
    emit_rows(rows, ["id", "last_error"], "tsv", stream=stream)
    assert stream.getvalue() == ('id\tlast_error\n1\texit 1\\nboom\\tat C:\\\\tmp "x"\\r\n2\t\n')
