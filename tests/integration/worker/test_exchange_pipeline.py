"""The exchange as it goes out through libpq's pipeline (db.pipelined): its
parameters sent as text, its statements prepared on first use.

What a worker sees: names of any printable characters claim their own jobs;
a statement that fails changes nothing, raises a psycopg error and leaves
the connection usable for the next exchange; the same exchange behind a
pooler (tests/integration/deploy/test_pgbouncer.py) sends nothing prepared.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgqctl import claims, db

LEASE = 300.0
# Each needs quoting in an array's text: quotes, a backslash, a comma, braces,
# a space, NULL spelled out.
NAMES = ['a"b', "c\\d", "e,f", "{g}", "h i", "NULL"]


def add(conn: psycopg.Connection[Any], queue: str, kind: str) -> int:
    row = conn.execute(
        "INSERT INTO jobs (queue, kind, payload) VALUES (%s, %s, '{}') RETURNING id",
        (queue, kind),
    ).fetchone()
    assert row is not None
    return int(row[0])


def claim_the_first_of_two(conn: psycopg.Connection[Any], c: db.QueueConnection) -> Any:
    """Two due jobs; `c` claims the first through the exchange. Returns
    (first id, second id, the claimed job)."""
    first, second = add(conn, "default", "x"), add(conn, "default", "x")
    [job] = claims.exchange(c, claim=1, lease=LEASE, worker="t").claimed
    assert job.id == first
    return first, second, job


def report_it_and_claim_the_second(c: db.QueueConnection, job: Any, second: int) -> None:
    """The next exchange goes through: it reports `job` done and claims `second`."""
    got = claims.exchange(c, done=[job.held], claim=1, lease=LEASE, worker="t")
    assert got.done == {job.id}
    assert [j.id for j in got.claimed] == [second]


@pytest.mark.parametrize("name", NAMES)
def test_a_worker_of_a_queue_or_kind_whose_name_needs_quoting_claims_its_jobs(
    conn: psycopg.Connection[Any], dsn: str, name: str
) -> None:
    other = add(conn, "other", "other")
    by_queue = add(conn, name, "x")
    by_kind = add(conn, "default", name)
    with db.connect(dsn, schema="public") as c:
        got = claims.exchange(c, claim=10, lease=LEASE, worker="t", queues=[name, "none"])
        assert [j.id for j in got.claimed] == [by_queue]
        got = claims.exchange(c, claim=10, lease=LEASE, worker="t", kinds=[name])
        assert [j.id for j in got.claimed] == [by_kind]
        # Reported done through the same statements, now prepared.
        done = claims.exchange(c, done=[(by_queue, 1), (by_kind, 1)], lease=LEASE, worker="t")
        assert done.done == {by_queue, by_kind}
    assert conn.execute("SELECT status FROM jobs WHERE id = %s", (other,)).fetchone() == (
        "pending",
    )


def test_a_failed_exchange_changes_nothing_and_the_next_one_goes_through(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    with db.connect(dsn, schema="public") as c:
        first, second, job = claim_the_first_of_two(conn, c)
        # A lease no interval holds: the statement fails after its report of
        # `first` ran, in the same transaction.
        with pytest.raises(psycopg.errors.DataError):
            claims.exchange(c, done=[job.held], claim=1, lease=1e300, worker="t")
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        statuses = dict(conn.execute("SELECT id, status FROM jobs").fetchall())
        assert statuses == {first: "running", second: "pending"}
        report_it_and_claim_the_second(c, job, second)


def test_the_exchange_outlives_psycopg_deallocating_every_prepared_statement(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    # psycopg prepares a statement run often enough, and when it then rolls a
    # transaction back it deallocates every prepared statement of the
    # connection, the exchange's too. Was: the next exchange failed with
    # "prepared statement pgqctl_0 does not exist", and the worker logged a
    # lost database and reconnected (a full disk's refusals did it).
    with db.connect(dsn, schema="public") as c:
        _, second, job = claim_the_first_of_two(conn, c)
        assert c.prepared
        for _ in range(6):  # past psycopg's prepare_threshold
            with c.transaction():
                c.execute("SELECT 1")
        with pytest.raises(psycopg.errors.DivisionByZero), c.transaction():
            c.execute("SELECT 1 / 0")
        ((left,),) = c.execute("SELECT count(*) FROM pg_prepared_statements").fetchall()
        assert left == 0  # psycopg's DEALLOCATE ALL took the exchange's statements
        report_it_and_claim_the_second(c, job, second)
        # Prepared again under names never given before.
        names = {name for (name,) in c.execute("SELECT name FROM pg_prepared_statements")}
        assert names and not names & {b"pgqctl_0".decode()}
