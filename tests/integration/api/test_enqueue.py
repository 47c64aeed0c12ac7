"""The Python API: enqueue inside the caller's own transaction (the outbox pattern)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

import pgqctl
from pgqctl.errors import BadInput
from tests.conftest import random_name, run_cli


@pytest.fixture
def listener(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection of its own listening on the channel workers listen on."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("LISTEN pgqctl_jobs")
        yield c


@pytest.fixture
def tx_conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection as an application has it: not in autocommit."""
    with psycopg.connect(dsn) as c:
        yield c


def notifications(listener: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    return [(n.channel, n.payload) for n in listener.notifies(timeout=0.5)]


def job_count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM jobs").fetchone()
    assert row is not None
    return int(row[0])


def test_committed_transaction_inserts_and_notifies_after_commit(
    tx_conn: psycopg.Connection[Any], conn: psycopg.Connection[Any], listener: Any
) -> None:
    job_id = pgqctl.enqueue(tx_conn, "send_receipt", {"order_id": 42}, priority=2)
    assert tx_conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    assert job_count(conn) == 0  # not visible, nobody woken, until the caller commits
    assert notifications(listener) == []
    tx_conn.commit()
    assert notifications(listener) == [("pgqctl_jobs", "public")]
    row = conn.execute("SELECT id, kind, payload, priority, status FROM jobs").fetchone()
    assert row == (job_id, "send_receipt", {"order_id": 42}, 2, "pending")


@pytest.mark.parametrize("how_many", [1, 5, 500])  # one INSERT from arrays; COPY from 200
def test_rolled_back_transaction_leaves_no_job_and_no_notification(
    tx_conn: psycopg.Connection[Any], conn: psycopg.Connection[Any], listener: Any, how_many: int
) -> None:
    with pytest.raises(RuntimeError), tx_conn.transaction():
        tx_conn.execute("CREATE TABLE orders (id int)")
        pgqctl.enqueue_many(tx_conn, [{"kind": "k", "payload": {"i": i}} for i in range(how_many)])
        raise RuntimeError("the request failed")
    assert job_count(conn) == 0
    assert notifications(listener) == []


@pytest.mark.parametrize("how_many", [3, 500])
def test_enqueue_many_returns_ids_in_order_and_wakes_workers_once(
    tx_conn: psycopg.Connection[Any], conn: psycopg.Connection[Any], listener: Any, how_many: int
) -> None:
    jobs = [{"kind": "k", "payload": {"i": i}, "queue": f"q{i % 2}"} for i in range(how_many)]
    with tx_conn.transaction():
        ids = pgqctl.enqueue_many(tx_conn, jobs)
    assert notifications(listener) == [("pgqctl_jobs", "public")]
    table = conn.execute("SELECT id, (payload->>'i')::int, queue FROM jobs ORDER BY id").fetchall()
    assert ids == [r[0] for r in table]
    assert [(r[1], r[2]) for r in table] == [(i, f"q{i % 2}") for i in range(how_many)]


def test_two_bulk_loads_in_one_transaction(tx_conn: psycopg.Connection[Any]) -> None:
    first = pgqctl.enqueue_many(tx_conn, [{"kind": "a"}] * 300)
    second = pgqctl.enqueue_many(tx_conn, [{"kind": "b"}] * 300)
    tx_conn.commit()
    assert len(set(first + second)) == 600
    assert job_count(tx_conn) == 600


def test_autocommit_each_call_is_its_own_transaction(
    conn: psycopg.Connection[Any], dsn: str, listener: Any
) -> None:
    pgqctl.enqueue(conn, "one")
    pgqctl.enqueue_many(conn, [{"kind": "many"}] * 250)
    assert notifications(listener) == [("pgqctl_jobs", "public")] * 2
    with psycopg.connect(dsn) as other:
        assert job_count(other) == 251


def test_timing_arguments(conn: psycopg.Connection[Any]) -> None:
    at = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    ids = [
        pgqctl.enqueue(conn, "later", delay=dt.timedelta(minutes=5)),
        pgqctl.enqueue(conn, "later", delay=30),
        pgqctl.enqueue(conn, "at", run_at=at),
        pgqctl.enqueue(conn, "at", run_at="2030-01-02T03:04:05Z"),
    ]
    got = conn.execute(
        "SELECT run_at - created_at, run_at FROM jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
    ).fetchall()
    assert [g[0] for g in got[:2]] == [dt.timedelta(minutes=5), dt.timedelta(seconds=30)]
    assert [g[1] for g in got[2:]] == [at, at]


def test_bad_input_raises_before_anything_is_sent(tx_conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(BadInput, match=r"^jobs\[1\]: priority must be an integer"):
        pgqctl.enqueue_many(tx_conn, [{"kind": "a"}, {"kind": "b", "priority": "high"}])
    with pytest.raises(ValueError, match="payload must be a JSON object"):
        pgqctl.enqueue(tx_conn, "k", ["not", "an", "object"])  # type: ignore[arg-type]
    # The caller's transaction is untouched and usable.
    assert tx_conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert job_count(tx_conn) == 0


def test_a_bad_job_in_a_bulk_load_raises_before_anything_is_sent(
    tx_conn: psycopg.Connection[Any],
) -> None:
    jobs: list[dict[str, Any]] = [{"kind": "k", "payload": {"i": i}} for i in range(500)]
    jobs[250] = {"kind": "k", "payload": {"text": "a\x00b"}}
    with pytest.raises(BadInput, match=r"^jobs\[250\]: payload contains a NUL character"):
        pgqctl.enqueue_many(tx_conn, jobs)
    assert tx_conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert job_count(tx_conn) == 0


def test_schema_argument_names_the_table(server_dsn: str, empty_dsn: str) -> None:
    schema = 'Odd "queue"'
    assert run_cli("migrate", "--schema", schema, "--dsn", empty_dsn).exit_code == 0
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        one = pgqctl.enqueue(c, "k", schema=schema)
        many = pgqctl.enqueue_many(c, [{"kind": "k"}] * 250, schema=schema)
        table = sql.Identifier(schema, "jobs")
        found = c.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(table)).fetchall()
        assert [r[0] for r in found] == [one, *many]
        assert c.execute("SELECT to_regclass('public.jobs')").fetchone() == (None,)


def test_text_that_copy_must_escape_arrives_as_given(conn: psycopg.Connection[Any]) -> None:
    odd = 'tab\there, line\nbreak, cr\r, back\\slash \\N, quote " and café 😀'
    name = 'back\\slash \\N, quote " and café 😀'  # a name holds no control character
    jobs = [{"kind": f"k {name}", "queue": name, "payload": {odd: [odd, i]}} for i in range(300)]
    ids = pgqctl.enqueue_many(conn, jobs)
    table = conn.execute(
        "SELECT kind, queue, payload FROM jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
    ).fetchall()
    assert table == [(j["kind"], j["queue"], j["payload"]) for j in jobs]


def _enqueue_every_way(c: psycopg.Connection[Any], tag: str = "") -> list[int]:
    """One job, one with a unique key, a few in one INSERT, and loads through
    COPY with and without keys: every statement the API sends. 505 new jobs."""
    keyed = [{"kind": "copy", "unique_key": f"{tag}{i}"} for i in range(250)]
    return [
        pgqctl.enqueue(c, "one"),
        pgqctl.enqueue(c, "keyed", unique_key=tag, on_conflict="error"),
        *pgqctl.enqueue_many(c, [{"kind": "few"}] * 3),
        *pgqctl.enqueue_many(c, [{"kind": "copy"}] * 250),
        *pgqctl.enqueue_many(c, keyed, on_conflict="error"),
    ]


def test_the_api_never_prepares_a_statement_and_keeps_the_callers(dsn: str) -> None:
    # A connection that prepares every statement at once: pgqctl's must not
    # be (behind a transaction pooler, another client would run them), and
    # the caller's own must stay prepared.
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as c:
        c.execute("SELECT %s::int", [1])
        ids = _enqueue_every_way(c, "a")
        with c.transaction():  # two loads through COPY in one transaction
            ids += _enqueue_every_way(c, "b")
        prepared = c.execute(
            "SELECT statement FROM pg_prepared_statements", prepare=False
        ).fetchall()
    assert prepared == [("SELECT $1::int",)]
    assert len(set(ids)) == 2 * 505


def test_the_api_works_whatever_row_factory_the_connection_has(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
        ids = _enqueue_every_way(c, "a")
        assert all(type(i) is int for i in ids)
        assert c.execute("SELECT count(*) AS n FROM jobs").fetchone() == {"n": len(ids)}


def test_the_api_refuses_what_is_over_a_limit_before_sending_anything(
    tx_conn: psycopg.Connection[Any],
) -> None:
    big = {"blob": "x" * 2_000_000}  # 2,000,011 bytes as JSON
    with pytest.raises(BadInput, match=r"^queue is 3,000 characters long: the limit is 128 "):
        pgqctl.enqueue(tx_conn, "k", queue=random_name(3000))
    with pytest.raises(BadInput, match=r"^unique_key holds the control character \\x0a at"):
        pgqctl.enqueue(tx_conn, "k", unique_key="user:7\nCRITICAL")
    with pytest.raises(BadInput, match=r"^payload is 2,000,011 bytes as JSON: the limit is 1,048,"):
        pgqctl.enqueue(tx_conn, "k", big)
    with pytest.raises(BadInput, match=r"^max_payload_bytes must be from 1 to"):
        pgqctl.enqueue(tx_conn, "k", max_payload_bytes=0)
    for n in (5, 250):  # one INSERT; COPY
        jobs: list[dict[str, Any]] = [{"kind": "k"}] * n
        jobs[n - 2] = {"kind": "k", "payload": big}
        with pytest.raises(BadInput, match=rf"^jobs\[{n - 2}\]: payload is 2,000,011 bytes"):
            pgqctl.enqueue_many(tx_conn, jobs)
    assert tx_conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert job_count(tx_conn) == 0
    # Raised, the same jobs go in.
    raised = 4 * 1024 * 1024
    pgqctl.enqueue(tx_conn, "k", big, max_payload_bytes=raised)
    for n in (5, 250):
        jobs = [{"kind": "k"}] * n
        jobs[n - 2] = {"kind": "k", "payload": big}
        pgqctl.enqueue_many(tx_conn, jobs, max_payload_bytes=raised)
    tx_conn.commit()
    assert job_count(tx_conn) == 1 + 5 + 250
