"""The limit key of a job (`pgqctl enqueue --limit-key`, a line's "limit_key",
``limit_key=`` in Python): stored in jobs.limit_key whichever way the job
is enqueued, and checked as a unique key is, before anything is written."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgqctl
from pgqctl.errors import BadInput
from pgqctl.intake import lines, loading
from tests.conftest import run_cli
from tests.integration.commands.test_enqueue_unique import producer_dsn
from tests.support.servers import roles

__all__ = ["producer_dsn", "roles"]

LONG = "k" * 257  # one over pgqctl.limits.MAX_KEY_CHARS


def keys(conn: psycopg.Connection[Any]) -> list[tuple[str, str | None]]:
    """(kind, limit_key) of every job, by id."""
    return conn.execute("SELECT kind, limit_key FROM jobs ORDER BY id").fetchall()


def count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM jobs").fetchone()
    assert row is not None
    return int(row[0])


def write_lines(path: Path, lines_: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines_), encoding="utf-8")
    return str(path)


# --- one job --------------------------------------------------------------------------


def test_one_job_stores_its_limit_key_and_a_job_without_one_has_none(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    given = run_cli("enqueue", "export", '{"customer": 42}', "--limit-key", "customer:42",
                    "--dsn", dsn)  # fmt: skip
    assert given.exit_code == 0, given.stderr
    plain = run_cli("enqueue", "export", "--dsn", dsn)
    assert plain.exit_code == 0, plain.stderr
    rows = conn.execute("SELECT id, limit_key FROM jobs ORDER BY id").fetchall()
    assert rows == [(int(given.stdout), "customer:42"), (int(plain.stdout), None)]


def test_the_limit_key_may_come_from_pgqctl_limit_key(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    env = {"PGQCTL_LIMIT_KEY": "tenant:7"}
    assert run_cli("enqueue", "a", "--dsn", dsn, env=env).exit_code == 0
    given = run_cli("enqueue", "b", "--limit-key", "tenant:8", "--dsn", dsn, env=env)
    assert given.exit_code == 0, given.stderr
    assert keys(conn) == [("a", "tenant:7"), ("b", "tenant:8")]


def test_every_kind_of_one_event_gets_the_same_limit_key(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    result = run_cli(
        "enqueue", "--kind", "send_receipt", "--kind", "update_crm", '{"order_id": 42}',
        "--limit-key", "customer:42", "--unique-key", "order:42", "--json", "--dsn", dsn,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    rows = conn.execute("SELECT id, kind, limit_key, unique_key FROM jobs ORDER BY id").fetchall()
    assert [{"id": r[0]} for r in rows] == json.loads(result.stdout)
    # The unique key holds per kind; the limit key is the one given, for each.
    assert [r[1:] for r in rows] == [
        ("send_receipt", "customer:42", "send_receipt:order:42"),
        ("update_crm", "customer:42", "update_crm:order:42"),
    ]


# --- a file of JSON lines ---------------------------------------------------------------

# JSON lines, each with the (kind, limit_key) of the jobs it makes.
LinesAndJobs = list[tuple[str, list[tuple[str, str | None]]]]
# Lines with a limit key that the quick checks take, then lines that go
# through the field checks (test_the_lines_above_take_the_paths_they_are_meant_to).
QUICK: LinesAndJobs = [
    ('{"kind": "q1", "limit_key": "customer:42"}', [("q1", "customer:42")]),
    ('{"kind": "q2", "payload": {"n": 1}, "limit_key": "café 😀", "queue": "default"}',
     [("q2", "café 😀")]),
    ('{"kind": "q3", "limit_key": "back\\\\slash \\\\N", "priority": 5}',
     [("q3", "back\\slash \\N")]),
    ('{"kind": "q4", "limit_key": null}', [("q4", None)]),
    ('{"kind": "q5", "limit_key": "payload", "payload": {"x": 1}}', [("q5", "payload")]),
]  # fmt: skip
CHECKED: LinesAndJobs = [
    ('{"kind": "c1", "limit_key": "customer:42", "delay": "5m"}', [("c1", "customer:42")]),
    ('{"kind": "c2", "limit_key": "caf\\u00e9"}', [("c2", "café")]),
    ('{"kinds": ["c3", "c4"], "limit_key": "customer:7", "unique_key": "e:1"}',
     [("c3", "customer:7"), ("c4", "customer:7")]),
    ('{"kind": "c5", "limit_key": "' + "k" * 256 + '", "run_at": "2030-01-01T00:00:00Z"}',
     [("c5", "k" * 256)]),
    ('{"kind": "c6", "limit_key": "u\\u2028v"}', [("c6", "u\u2028v")]),
]  # fmt: skip


def test_the_lines_above_take_the_paths_they_are_meant_to() -> None:
    fast = lines.simple_defaults(None)
    assert fast is not None
    assert all(lines.simple_line_row(1, line, fast) is not None for line, _ in QUICK)
    assert all(lines.simple_line_row(1, line, fast) is None for line, _ in CHECKED)


# 600 lines without a key first: the first chunk of the load (500 lines) has
# none, the next has some; else every chunk has some. Both through COPY and,
# for a role without TEMP, from arrays.
@pytest.mark.parametrize("keyless_first", [0, 600])
def test_a_file_stores_the_limit_key_of_each_line(
    producer_dsn: str,
    conn: psycopg.Connection[Any],
    tmp_path: Path,
    keyless_first: int,
) -> None:
    keyless: LinesAndJobs = [
        (json.dumps({"kind": "n", "payload": {"i": i}}), [("n", None)])
        for i in range(keyless_first)
    ]
    given: LinesAndJobs = [*keyless, *QUICK, ('{"kind": "plain"}', [("plain", None)]), *CHECKED]
    path = write_lines(tmp_path / "jobs.jsonl", [line for line, _ in given])
    result = run_cli("enqueue", "--file", path, "--json", "--dsn", producer_dsn)
    assert result.exit_code == 0, result.stderr
    assert len(json.loads(result.stdout)) == count(conn)
    assert keys(conn) == [job for _, jobs in given for job in jobs]


def test_limit_key_fills_the_lines_that_give_none(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    path = write_lines(
        tmp_path / "jobs.jsonl",
        [
            '{"kind": "a"}',
            '{"kind": "b", "limit_key": "own"}',
            '{"kind": "c", "limit_key": null, "queue": "q"}',
            '{"kind": "d", "delay": 5}',
        ],
    )
    result = run_cli("enqueue", "--file", path, "--limit-key", "tenant:1", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert keys(conn) == [("a", "tenant:1"), ("b", "own"), ("c", "tenant:1"), ("d", "tenant:1")]


# --- the Python API ----------------------------------------------------------------------


def test_enqueue_stores_the_limit_key_for_one_kind_and_for_each_of_a_list(
    conn: psycopg.Connection[Any],
) -> None:
    one = pgqctl.enqueue(conn, "export", {"customer": 42}, limit_key="customer:42")
    many = pgqctl.enqueue(conn, ["a", "b"], {}, limit_key="customer:7", unique_key="e:1")
    none = pgqctl.enqueue(conn, "plain")
    rows = conn.execute("SELECT id, kind, limit_key FROM jobs ORDER BY id").fetchall()
    assert rows == [
        (one, "export", "customer:42"),
        (many[0], "a", "customer:7"),
        (many[1], "b", "customer:7"),
        (none, "plain", None),
    ]


@pytest.mark.parametrize("how_many", [5, 300])  # one INSERT from arrays; COPY from 200
def test_enqueue_many_stores_the_limit_key_of_each_record(
    conn: psycopg.Connection[Any], how_many: int
) -> None:
    records: list[dict[str, Any]] = [{"kind": "n", "payload": {"i": i}} for i in range(how_many)]
    records[1] = {"kind": "k1", "limit_key": "customer:1"}
    records[2] = {"kind": "k2", "limit_key": "customer:2", "delay": 5}  # the field checks
    records[3] = {"kinds": ["k3", "k4"], "limit_key": "customer:3"}
    records[4] = {"kind": "k5", "limit_key": "customer:1", "unique_key": "u"}
    ids = pgqctl.enqueue_many(conn, records)
    assert len(ids) == how_many + 1 == count(conn)
    stored = keys(conn)
    assert stored[:6] == [
        ("n", None),
        ("k1", "customer:1"),
        ("k2", "customer:2"),
        ("k3", "customer:3"),
        ("k4", "customer:3"),
        ("k5", "customer:1"),
    ]
    assert stored[6:] == [("n", None)] * (how_many - 5)


# --- refusals ------------------------------------------------------------------------------

REFUSED_ARGUMENTS = [
    (LONG, "limit_key is 257 characters long: the limit is 256 characters"),
    ("a\tb", r"limit_key holds the control character \x09 at character 2"),
    ("customer\x1b[2J", r"limit_key holds the control character \x1b at character 9"),
    ("k\x85", r"limit_key holds the control character \x85 at character 2"),
    ("", "limit_key must not be empty or only spaces"),
]


@pytest.mark.parametrize(("key", "message"), REFUSED_ARGUMENTS)
def test_a_bad_limit_key_exits_2_and_writes_nothing(
    module_dsn: str, key: str, message: str
) -> None:
    for args in (("k",), ("--kind", "a", "--kind", "b")):
        result = run_cli("enqueue", *args, "--limit-key", key, "--dsn", module_dsn)
        assert result.exit_code == 2, result.stderr
        assert result.stderr.startswith(f"pgqctl: error: {message}")
        assert len(result.stderr.splitlines()) == 1
        assert result.stdout == ""
    with psycopg.connect(module_dsn) as c:
        assert count(c) == 0


# Each value as a line's "limit_key", on its own and with a field that sends
# the line through the field checks: refused alike, naming the line.
REFUSED_VALUES = [
    (LONG, "limit_key is 257 characters long: the limit is 256 characters"),
    ("a\nb", r"limit_key holds the control character \x0a at character 2"),
    ("\x7fk", r"limit_key holds the control character \x7f at character 1"),
    ("   ", "limit_key must not be empty or only spaces"),
    (42, "limit_key must be a string, not a number"),
    (True, "limit_key must be a string, not a boolean"),
    (["customer:42"], "limit_key must be a string, not an array"),
    ({"customer": 42}, "limit_key must be a string, not an object"),
]


@pytest.mark.parametrize("extra", [{}, {"delay": 5}], ids=["quick", "checked"])
@pytest.mark.parametrize(("value", "message"), REFUSED_VALUES)
def test_a_line_with_a_bad_limit_key_exits_2_naming_it_and_writes_nothing(
    dsn: str,
    conn: psycopg.Connection[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    value: Any,
    message: str,
    extra: dict[str, Any],
) -> None:
    # Line 250 of 300, read once the load has begun: the first chunk, with
    # limit keys, has gone through COPY.
    monkeypatch.setattr(loading, "CHUNK_JOBS", 100)
    records: list[Any] = [{"kind": "ok", "limit_key": f"c:{i % 3}"} for i in range(300)]
    records[249] = {"kind": "bad", "limit_key": value, **extra}
    path = tmp_path / "jobs.jsonl"
    # As a user's tool writes it: raw characters, no \u escapes.
    path.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8"
    )
    result = run_cli("enqueue", "--file", str(path), "--dsn", dsn)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"pgqctl: error: {path}, line 250: {message}")
    assert result.stderr.endswith("; nothing was enqueued\n")
    assert len(result.stderr.splitlines()) == 1
    assert result.stdout == ""
    assert count(conn) == 0


def test_a_bad_limit_key_for_a_file_is_refused_once_before_reading_it(
    module_dsn: str, tmp_path: Path
) -> None:
    path = write_lines(tmp_path / "jobs.jsonl", ['{"kind": "a"}', '{"kind": "b"}'])
    result = run_cli("enqueue", "--file", path, "--limit-key", LONG, "--dsn", module_dsn)
    assert result.exit_code == 2
    assert result.stderr == (
        "pgqctl: error: limit_key is 257 characters long: the limit is 256 characters; "
        "give a shorter limit_key\n"
    )
    with psycopg.connect(module_dsn) as c:
        assert count(c) == 0


@pytest.mark.parametrize("how_many", [5, 300])
@pytest.mark.parametrize(("value", "message"), REFUSED_VALUES)
def test_the_python_api_refuses_a_bad_limit_key_before_sending_anything(
    conn: psycopg.Connection[Any], value: Any, message: str, how_many: int
) -> None:
    with pytest.raises(BadInput, match=f"^{re.escape(message)}"):
        pgqctl.enqueue(conn, "k", limit_key=value)
    records: list[Any] = [{"kind": "ok", "limit_key": "c"} for _ in range(how_many)]
    records[3] = {"kind": "bad", "limit_key": value}
    with pytest.raises(BadInput, match=rf"^jobs\[3\]: {re.escape(message)}"):
        pgqctl.enqueue_many(conn, records)
    assert count(conn) == 0
