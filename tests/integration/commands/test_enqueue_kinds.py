"""One event, many consumers: one enqueue of a payload for several kinds makes
one job per kind, all of them or none, each then claimed, retried and failed
on its own; a unique key holds per kind. Through the CLI (--kind, and
"kinds" in --file lines) and the Python API."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import psycopg
import pytest

import pgqctl
from pgqctl.errors import BadInput
from tests.conftest import run_cli
from tests.integration.commands.test_enqueue_unique import producer_dsn, roles, write_lines

__all__ = ["producer_dsn", "roles"]

ORDER = '{"order_id": 42}'
THREE = ("--kind", "send_receipt", "--kind", "update_crm", "--kind", "notify_warehouse")


def jobs(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """(id, kind, payload, status, attempts, unique_key) of every job, by id."""
    return conn.execute(
        "SELECT id, kind, payload, status, attempts, unique_key FROM jobs ORDER BY id"
    ).fetchall()


def enqueue(dsn: str, *args: str) -> list[int]:
    result = run_cli("enqueue", *args, "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    return [int(line) for line in result.stdout.split()]


def statuses(conn: psycopg.Connection[Any]) -> dict[str, str]:
    return dict(conn.execute("SELECT kind, status FROM jobs").fetchall())


def burst(dsn: str, *args: str) -> None:
    result = run_cli("worker", "--burst", "--backoff", "1ms", *args, "--dsn", dsn)
    assert result.exit_code == 0, result.stderr


# --- the CLI ---------------------------------------------------------------------


def test_one_enqueue_of_three_kinds_makes_three_jobs_and_prints_their_ids_in_order(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    ids = enqueue(dsn, *THREE, ORDER)
    assert len(ids) == 3
    assert [(r[0], r[1], r[2], r[3]) for r in jobs(conn)] == [
        (ids[0], "send_receipt", {"order_id": 42}, "pending"),
        (ids[1], "update_crm", {"order_id": 42}, "pending"),
        (ids[2], "notify_warehouse", {"order_id": 42}, "pending"),
    ]

    as_json = run_cli("enqueue", "--kind", "b", "--kind", "a", "--json", "--dsn", dsn)
    assert as_json.exit_code == 0, as_json.stderr
    printed = json.loads(as_json.stdout)
    kinds = dict(conn.execute("SELECT id, kind FROM jobs").fetchall())
    assert [kinds[r["id"]] for r in printed] == ["b", "a"]
    assert all(list(r) == ["id"] for r in printed)


def test_a_worker_with_kind_takes_only_the_job_of_its_kind(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    enqueue(dsn, *THREE, '{"argv": ["true"]}')
    burst(dsn, "--kind", "update_crm")
    assert statuses(conn) == {
        "send_receipt": "pending",
        "update_crm": "done",
        "notify_warehouse": "pending",
    }
    burst(dsn, "--kind", "send_receipt", "--kind", "notify_warehouse")
    assert set(statuses(conn).values()) == {"done"}


def test_one_kind_failing_is_retried_and_failed_alone_while_the_others_are_done(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    ids = enqueue(dsn, *THREE, ORDER, "--max-attempts", "2")
    handlers = ("send_receipt=true", "update_crm=false", "notify_warehouse=true")
    burst(dsn, *(arg for h in handlers for arg in ("--handler", h)))
    assert [(r[0], r[1], r[3], r[4]) for r in jobs(conn)] == [
        (ids[0], "send_receipt", "done", 1),
        (ids[1], "update_crm", "failed", 2),
        (ids[2], "notify_warehouse", "done", 1),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--kind", "a", "--kind", "b\nc"), "--kind[1]: kind holds the control character \\x0a"),
        (("--kind", "a", "--kind", ""), "--kind[1]: kind must not be empty"),
        (("--kind", "a", "--kind", "b", "--kind", "a"), "--kind names the kind 'a' twice"),
        (("--kind", "a", "--kind", "k" * 129), "kind is 129 characters long"),
        (("--kind", "a", "b"), "give KIND or --kind, not both"),
        (("x", "--kind", "a", ORDER), "give KIND or --kind, not both"),
        (("--kind", "a", "--file", "-"), "give --kind or --file, not both"),
        (("--kind", "a", '{"argv": []}'), "payload cannot run"),
    ],
)
def test_bad_kinds_exit_2_and_enqueue_none_of_the_jobs(
    module_dsn: str, args: tuple[str, ...], message: str
) -> None:
    result = run_cli("enqueue", *args, "--dsn", module_dsn, input="")
    assert (result.exit_code, result.stdout) == (2, "")
    assert message in result.stderr and "Traceback" not in result.stderr
    with psycopg.connect(module_dsn) as c:
        assert c.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_a_workers_pgqctl_kind_in_the_environment_is_not_read_as_kinds(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    result = run_cli("enqueue", "report", "--dsn", dsn, env={"PGQCTL_KIND": "mail sms"})
    assert result.exit_code == 0, result.stderr
    assert [r[1] for r in jobs(conn)] == ["report"]


def test_a_kind_the_policy_refuses_refuses_them_all(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        'handlers_only = true\nprograms = ["/bin", "/usr/bin"]\n[handlers]\nmail = "true"\n'
    )
    result = run_cli(
        "enqueue", "--kind", "mail", "--kind", "report", ORDER, "--policy", str(policy),
        "--dsn", dsn,
    )  # fmt: skip
    assert (result.exit_code, result.stdout) == (2, "")
    assert "refused by the policy" in result.stderr and "'report'" in result.stderr
    assert jobs(conn) == []


# --- unique keys hold per kind -----------------------------------------------------


def test_a_unique_key_holds_per_kind(dsn: str, conn: psycopg.Connection[Any]) -> None:
    key = ("--unique-key", "order:42")
    first = enqueue(dsn, *THREE, ORDER, *key)
    assert [r[5] for r in jobs(conn)] == [
        "send_receipt:order:42",
        "update_crm:order:42",
        "notify_warehouse:order:42",
    ]

    # The same event again: every kind's job is still pending, so none is added.
    again = run_cli("enqueue", *THREE, ORDER, *key, "--json", "--dsn", dsn)
    assert json.loads(again.stdout) == [{"id": i, "existing": True} for i in first]
    assert f"job {first[1]} already has unique key 'update_crm:order:42'" in again.stderr

    # Once update_crm's job is done, its key is free: only that kind gets a new job.
    burst(dsn, "--kind", "update_crm", "--handler", "update_crm=true")
    third = enqueue(dsn, *THREE, ORDER, *key)
    assert third[0] == first[0] and third[2] == first[2] and third[1] > first[2]
    assert len(jobs(conn)) == 4

    # Another key, and a one-kind job with the plain key, are other slots.
    other = enqueue(dsn, *THREE, ORDER, "--unique-key", "order:43")
    plain = enqueue(dsn, "send_receipt", ORDER, *key)
    assert len(set(other + plain) & set(first + third)) == 0
    # The key a one-kind job of the same kind gives as KIND:KEY is the same slot.
    assert enqueue(dsn, "send_receipt", ORDER, "--unique-key", "send_receipt:order:42") == [
        first[0]
    ]
    assert len(jobs(conn)) == 8


def test_under_error_a_held_key_of_one_kind_enqueues_none(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (held,) = enqueue(dsn, "--kind", "update_crm", ORDER, "--unique-key", "order:42")
    result = run_cli(
        "enqueue", *THREE, ORDER, "--unique-key", "order:42", "--on-conflict", "error",
        "--dsn", dsn,
    )  # fmt: skip
    assert (result.exit_code, result.stdout) == (1, "")
    assert f"job {held} (pending) already has unique key 'update_crm:order:42'" in result.stderr
    assert [r[0] for r in jobs(conn)] == [held]


# --- --file lines with "kinds" ------------------------------------------------------


def test_file_lines_with_kinds_make_one_job_per_kind_in_line_order(
    producer_dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    lines: list[dict[str, Any]] = [
        {"kinds": ["a", "b"], "payload": {"n": 0}, "unique_key": "e0"},
        {"kind": "c", "payload": {"n": 1}},
        {"kinds": ["c", "b", "a"], "payload": {"n": 2}, "queue": "q"},
        {"kinds": ["b"], "payload": {"n": 3}, "unique_key": "e0"},  # b's key of line 1
    ]
    # Enough lines for chunks that go through COPY (or arrays, for a role without TEMP).
    lines += [{"kinds": ["x", "y"], "payload": {"n": n}} for n in range(4, 404)]
    result = run_cli(
        "enqueue", "--file", write_lines(tmp_path / "j.jsonl", lines), "--json",
        "--dsn", producer_dsn,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    printed = json.loads(result.stdout)
    assert len(printed) == 2 + 1 + 3 + 1 + 800
    rows = {
        r[0]: r[1:]
        for r in conn.execute("SELECT id, kind, (payload->>'n')::int, queue, unique_key FROM jobs")
    }
    got = [(*rows[p["id"]], p.get("existing", False)) for p in printed]
    assert got[:7] == [
        ("a", 0, "default", "a:e0", False),
        ("b", 0, "default", "b:e0", False),
        ("c", 1, "default", None, False),
        ("c", 2, "q", None, False),
        ("b", 2, "q", None, False),
        ("a", 2, "q", None, False),
        ("b", 0, "default", "b:e0", True),
    ]
    assert got[7:] == [
        (kind, n, "default", None, False) for n in range(4, 404) for kind in ("x", "y")
    ]
    # Ids follow the lines, and the kinds of a line, in order.
    new = [p["id"] for p in printed if "existing" not in p]
    assert new == sorted(new)
    assert len(rows) == 806


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"kinds": ["a"], "kind": "a"}, 'line 2: give "kind" or "kinds", not both'),
        ({"payload": {}}, 'line 2: missing "kind" (or "kinds"'),
        ({"kinds": []}, 'line 2: "kinds" must name at least one kind'),
        ({"kinds": "a"}, 'line 2: "kinds" must be a list of kinds'),
        ({"kinds": ["a", 7]}, 'line 2: "kinds"[1]: kind must be a string, not a number'),
        ({"kinds": ["a", "b", "a"]}, "line 2: \"kinds\" names the kind 'a' twice"),
        ({"kinds": ["a"], "payload": {"argv": "x"}}, "line 2: payload cannot run"),
    ],
)
def test_a_bad_kinds_line_exits_2_naming_it_and_enqueues_nothing(
    module_dsn: str, tmp_path: Path, line: dict[str, Any], message: str
) -> None:
    path = write_lines(tmp_path / "j.jsonl", [{"kinds": ["ok", "fine"]}, line])
    result = run_cli("enqueue", "--file", path, "--dsn", module_dsn)
    assert (result.exit_code, result.stdout) == (2, "")
    assert message in result.stderr and "nothing was enqueued" in result.stderr
    with psycopg.connect(module_dsn) as c:
        assert c.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_a_key_repeated_by_a_later_kinds_line_under_error_names_both_lines(
    producer_dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    lines = [
        {"kinds": ["a", "b"], "unique_key": "k"},
        {"kind": "c"},
        {"kinds": ["b"], "unique_key": "k"},
    ]
    result = run_cli(
        "enqueue", "--file", write_lines(tmp_path / "j.jsonl", lines), "--on-conflict", "error",
        "--dsn", producer_dsn,
    )  # fmt: skip
    assert (result.exit_code, result.stdout) == (2, "")
    assert "line 3 repeats the unique key 'b:k' (queue 'default') of" in result.stderr
    assert "line 1;" in result.stderr
    assert jobs(conn) == []


# --- the Python API ------------------------------------------------------------------


def test_api_a_list_of_kinds_returns_their_ids_and_one_kind_an_id(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(dsn) as app:
        ids = pgqctl.enqueue(app, ["send_receipt", "update_crm"], {"order_id": 42})
        one = pgqctl.enqueue(app, "audit", {"order_id": 42})
        listed = pgqctl.enqueue(app, ("notify_warehouse",), {"order_id": 42})
        assert job_kinds(conn) == []  # the caller's transaction decides
        app.commit()
    assert isinstance(ids, list) and isinstance(one, int) and isinstance(listed, list)
    assert [(r[0], r[1]) for r in jobs(conn)] == [
        (ids[0], "send_receipt"),
        (ids[1], "update_crm"),
        (one, "audit"),
        (listed[0], "notify_warehouse"),
    ]


def job_kinds(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute("SELECT kind FROM jobs ORDER BY id")]


@pytest.mark.parametrize(
    ("kinds", "message"),
    [
        (["a", "a"], "kind names the kind 'a' twice"),
        (["a", ""], r"kind\[1\]: kind must not be empty"),
        ([], "kind must name at least one kind"),
        (["k"] * 1001, "kind names 1,001 kinds: the limit is 1,000"),
        (7, "kind must be a string, not a number"),
    ],
)
def test_api_bad_kinds_raise_before_anything_is_sent(
    module_dsn: str, kinds: Any, message: str
) -> None:
    with psycopg.connect(module_dsn) as app:
        app.execute("SELECT 1")
        with pytest.raises(BadInput, match=message):
            pgqctl.enqueue(app, kinds, {})
        app.execute("SELECT 1")  # the transaction is still usable
        app.commit()
        assert app.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_api_a_held_key_under_error_leaves_none_of_the_kinds_and_the_callers_work(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(dsn) as app:
        (held,) = pgqctl.enqueue(app, ["b"], {}, unique_key="e")
        app.commit()
        pgqctl.enqueue(app, "mine", {})
        with pytest.raises(pgqctl.DuplicateJob) as raised:
            pgqctl.enqueue(app, ["a", "b", "c"], {}, unique_key="e", on_conflict="error")
        assert raised.value.holder == held and raised.value.unique_key == "b:e"
        skipped = pgqctl.enqueue(app, ["a", "b", "c"], {}, unique_key="e")
        assert skipped[1] == held and skipped.existing == {1}  # type: ignore[attr-defined]
        app.commit()
    assert job_kinds(conn) == ["b", "mine", "a", "c"]


@pytest.mark.parametrize("how_many", [3, 300])  # from arrays; through COPY from 200
def test_api_enqueue_many_with_kinds(
    dsn: str, conn: psycopg.Connection[Any], how_many: int
) -> None:
    records: list[Mapping[str, Any]] = [
        {"kinds": ["a", "b"], "payload": {"i": i}, "unique_key": f"u{i}"} for i in range(how_many)
    ]
    records.insert(1, {"kind": "plain"})
    records[0] = MappingProxyType(records[0])  # any mapping will do
    with psycopg.connect(dsn, autocommit=True) as app:
        ids = pgqctl.enqueue_many(app, records)
        again = pgqctl.enqueue_many(app, records[2:3])
        with pytest.raises(BadInput, match=r"jobs\[2\]: \"kinds\" names the kind 'a' twice"):
            pgqctl.enqueue_many(app, [{"kind": "x"}, {"kinds": ["a"]}, {"kinds": ["a", "a"]}])
    assert len(ids) == 2 * how_many + 1
    assert again == ids[3:5] and again.existing == {0, 1}  # type: ignore[attr-defined]
    got = conn.execute(
        "SELECT id, kind, (payload->>'i')::int, unique_key FROM jobs ORDER BY id"
    ).fetchall()
    assert [r[0] for r in got] == ids
    expected = [("a", 0, "a:u0"), ("b", 0, "b:u0"), ("plain", None, None)]
    expected += [(k, i, f"{k}:u{i}") for i in range(1, how_many) for k in ("a", "b")]
    assert [r[1:] for r in got] == expected


# --- plain SQL, as the README shows it ----------------------------------------------


def test_plain_sql_unnest_makes_a_job_per_kind_whose_keys_the_cli_sees(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    insert = """
        INSERT INTO jobs (kind, payload, unique_key)
        SELECT kind, '{"order_id": 42}', kind || ':order:42'
        FROM unnest(ARRAY['send_receipt', 'update_crm', 'notify_warehouse']) AS kind
        ON CONFLICT DO NOTHING
        RETURNING id, kind
    """
    added = conn.execute(insert).fetchall()
    assert [kind for _, kind in added] == ["send_receipt", "update_crm", "notify_warehouse"]
    assert conn.execute(insert).fetchall() == []
    result = run_cli("enqueue", *THREE, ORDER, "--unique-key", "order:42", "--json", "--dsn", dsn)
    assert json.loads(result.stdout) == [{"id": i, "existing": True} for i, _ in sorted(added)]
