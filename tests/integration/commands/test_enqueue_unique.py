"""Unique jobs: at most one pending or running job per (queue, unique key),
from the CLI (one job and bulk, through COPY and from arrays), the Python
API and plain SQL, against racing producers."""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgqctl
from pgqctl.errors import BadInput
from tests.conftest import run_cli
from tests.support.jobrows import add_jobs
from tests.support.servers import Roles, dbname_of, roles

__all__ = ["roles"]

PRODUCERS = 8


def keyed(conn: psycopg.Connection[Any], key: str) -> list[tuple[int, str, str]]:
    """(id, queue, status) of the jobs with this key, by id."""
    return conn.execute(
        "SELECT id, queue, status FROM jobs WHERE unique_key = %s ORDER BY id", (key,)
    ).fetchall()


def job_count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM jobs").fetchone()
    assert row is not None
    return int(row[0])


# --- racing producers ----------------------------------------------------------------


def _produce(dsn: str, on_conflict: str, start: Any, results: Any) -> None:
    """One producer process: its own connection, released with the others at once.

    It holds its transaction open a moment after the INSERT, so the others
    meet its row uncommitted and must wait for it.
    """
    try:
        with psycopg.connect(dsn) as conn:
            start.wait(timeout=30)
            with conn.transaction():
                ids = pgqctl.enqueue_many(
                    conn,
                    [{"kind": "sync", "payload": {"user": 7}, "unique_key": "user:7"}],
                    on_conflict=on_conflict,
                )
                time.sleep(0.2)
            results.put(("ok", ids[0], sorted(ids.existing)))  # type: ignore[attr-defined]
    except pgqctl.DuplicateJob as exc:
        results.put(("duplicate", exc.holder, str(exc)))
    except Exception as exc:  # reported to the test, which fails on it
        results.put(("crash", None, repr(exc)))


def race(dsn: str, on_conflict: str) -> list[tuple[str, int | None, Any]]:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(PRODUCERS)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_produce, args=(dsn, on_conflict, start, results))
        for _ in range(PRODUCERS)
    ]
    for p in procs:
        p.start()
    try:
        return [results.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)


@pytest.mark.slow
def test_eight_racing_producers_make_one_job_and_all_get_its_id(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    reports = race(dsn, "skip")
    ((job_id, queue, status),) = keyed(conn, "user:7")
    assert (queue, status) == ("default", "pending")
    assert [r[:2] for r in reports] == [("ok", job_id)] * PRODUCERS
    # One inserted it; each of the others was given it as the existing job.
    assert sorted(len(r[2]) for r in reports) == [0] + [1] * (PRODUCERS - 1)


def test_eight_racing_producers_under_error_one_wins_the_others_are_told_which(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    reports = race(dsn, "error")
    ((job_id, _, _),) = keyed(conn, "user:7")
    assert sorted(r[0] for r in reports) == ["duplicate"] * (PRODUCERS - 1) + ["ok"]
    for kind, holder, message in reports:
        assert holder == job_id
        if kind == "duplicate":
            assert f"job {job_id} (pending) already has unique key 'user:7'" in message


# --- one job from the CLI ---------------------------------------------------------------


def test_enqueue_skip_prints_the_existing_id_and_error_exits_1_naming_it(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    first = run_cli("enqueue", "sync", "--unique-key", "user:7", "--dsn", dsn)
    assert first.exit_code == 0, first.stderr
    job_id = int(first.stdout)

    again = run_cli("enqueue", "sync", "--unique-key", "user:7", "--dsn", dsn)
    assert (again.exit_code, again.stdout) == (0, f"{job_id}\n")
    assert f"job {job_id} already has unique key 'user:7' in queue 'default'" in again.stderr

    as_json = run_cli("enqueue", "sync", "--unique-key", "user:7", "--json", "--dsn", dsn)
    assert json.loads(as_json.stdout) == [{"id": job_id, "existing": True}]

    refused = run_cli(
        "enqueue", "sync", "--unique-key", "user:7", "--on-conflict", "error", "--dsn", dsn
    )
    assert (refused.exit_code, refused.stdout) == (1, "")
    assert f"job {job_id} (pending) already has unique key 'user:7'" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

    # The key is per queue; a job without a key is never held.
    other = run_cli("enqueue", "sync", "--unique-key", "user:7", "--queue", "slow", "--dsn", dsn)
    plain = run_cli("enqueue", "sync", "--json", "--dsn", dsn)
    assert json.loads(plain.stdout) == [{"id": int(plain.stdout.split()[1].rstrip("}]"))}]
    assert [(q, s) for _, q, s in keyed(conn, "user:7")] == [
        ("default", "pending"),
        ("slow", "pending"),
    ]
    assert int(other.stdout) != job_id
    assert job_count(conn) == 3


def test_a_key_is_free_again_once_its_job_is_done_or_failed(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    def enqueue(payload: dict[str, Any]) -> int:
        result = run_cli(
            "enqueue", "sync", json.dumps(payload), "--unique-key", "k", "--max-attempts", "1",
            "--on-conflict", "error", "--dsn", dsn,
        )  # fmt: skip
        assert result.exit_code == 0, result.stderr
        return int(result.stdout)

    done = enqueue({"argv": ["true"]})
    assert run_cli("worker", "--burst", "--dsn", dsn).exit_code == 0
    failed = enqueue({"argv": ["false"]})
    assert run_cli("worker", "--burst", "--dsn", dsn).exit_code == 0
    pending = enqueue({"argv": ["true"]})
    assert keyed(conn, "k") == [
        (done, "default", "done"),
        (failed, "default", "failed"),
        (pending, "default", "pending"),
    ]
    # Running holds it too.
    conn.execute("UPDATE jobs SET status = 'running', attempts = 1 WHERE id = %s", (pending,))
    held = run_cli("enqueue", "sync", "--unique-key", "k", "--dsn", dsn)
    assert held.stdout == f"{pending}\n"


# --- bulk: COPY, and arrays for a role that may not create temporary tables ------------


@pytest.fixture(params=["copy", "arrays"])
def producer_dsn(request: pytest.FixtureRequest, dsn: str, roles: Roles) -> Iterator[str]:
    """The test database as a role that loads through COPY (the superuser) or,
    without the TEMP privilege, from arrays."""
    if request.param == "copy":
        yield dsn
        return
    app = roles.create("app")
    with psycopg.connect(dsn, autocommit=True) as c:
        database = sql.Identifier(dbname_of(dsn))
        c.execute(sql.SQL("REVOKE TEMP ON DATABASE {} FROM PUBLIC").format(database))
        c.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(app)))
        c.execute(
            sql.SQL(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}"
            ).format(sql.Identifier(app))
        )
    app_dsn = roles.dsn(dsn, app)
    with psycopg.connect(app_dsn) as c:
        assert c.execute(
            "SELECT has_database_privilege(current_database(), 'TEMP')"
        ).fetchone() == (False,)
    yield app_dsn


def write_lines(path: Path, records: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_bulk_skip_first_line_wins_and_existing_jobs_are_marked(
    producer_dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    (held,) = add_jobs(conn, unique_key="a")
    path = write_lines(
        tmp_path / "jobs.jsonl",
        [
            {"kind": "x", "unique_key": "a"},
            {"kind": "x", "unique_key": "b", "payload": {"n": 1}},
            {"kind": "x"},
            {"kind": "x", "unique_key": "b", "payload": {"n": 2}},
            {"kind": "x", "unique_key": "a", "queue": "other"},
        ],
    )
    result = run_cli("enqueue", "--file", path, "--json", "--dsn", producer_dsn)
    assert result.exit_code == 0, result.stderr
    printed = json.loads(result.stdout)
    b, plain, other = (r["id"] for r in (printed[1], printed[2], printed[4]))
    assert printed == [
        {"id": held, "existing": True},
        {"id": b},
        {"id": plain},
        {"id": b, "existing": True},
        {"id": other},
    ]
    assert "enqueued 3 jobs; 2 jobs skipped" in result.stderr
    rows = conn.execute(
        "SELECT id, queue, unique_key, payload FROM jobs WHERE id <> %s ORDER BY id", (held,)
    ).fetchall()
    assert rows == [
        (b, "default", "b", {"n": 1}),  # the first line with the key
        (plain, "default", None, {}),
        (other, "other", "a", {}),
    ]


def test_bulk_keys_across_chunks_and_mixed_with_keyless_lines(
    producer_dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    # Every key twice, far apart: the second is in a later chunk of the load.
    n = 1500
    records = [{"kind": "x", "unique_key": f"k{i % n}", "payload": {"i": i}} for i in range(2 * n)]
    records[7:7] = [{"kind": "plain"}] * 5
    path = write_lines(tmp_path / "jobs.jsonl", records)
    result = run_cli("enqueue", "--file", path, "--json", "--dsn", producer_dsn)
    assert result.exit_code == 0, result.stderr
    printed = json.loads(result.stdout)
    by_payload = dict(
        conn.execute("SELECT (payload->>'i')::int, id FROM jobs WHERE kind = 'x'").fetchall()
    )
    plain = iter(r[0] for r in conn.execute("SELECT id FROM jobs WHERE kind = 'plain' ORDER BY id"))
    expected = []
    for r in records:
        if r["kind"] == "plain":
            expected.append({"id": next(plain)})
            continue
        i = r["payload"]["i"]
        expected.append({"id": by_payload[i % n], **({"existing": True} if i >= n else {})})
    assert printed == expected
    assert job_count(conn) == n + 5
    assert set(by_payload) == set(range(n))  # the first of each key


def test_bulk_error_inserts_nothing_on_a_held_key_or_a_key_given_twice(
    producer_dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    (held,) = add_jobs(conn, unique_key="a")
    lines = [{"kind": "x"}, {"kind": "x", "unique_key": "b"}, {"kind": "x", "unique_key": "a"}]
    path = write_lines(tmp_path / "held.jsonl", lines)
    result = run_cli("enqueue", "--file", path, "--on-conflict", "error", "--dsn", producer_dsn)
    assert (result.exit_code, result.stdout) == (1, "")
    assert f"job {held} (pending) already has unique key 'a'" in result.stderr
    assert "nothing was enqueued" in result.stderr
    assert job_count(conn) == 1

    twice = [{"kind": "x", "unique_key": "c"}, {"kind": "x"}, {"kind": "x", "unique_key": "c"}]
    path = write_lines(tmp_path / "twice.jsonl", twice)
    result = run_cli("enqueue", "--file", path, "--on-conflict", "error", "--dsn", producer_dsn)
    assert (result.exit_code, result.stdout) == (2, "")
    assert "line 3 repeats the unique key 'c' (queue 'default') of" in result.stderr
    assert "line 1" in result.stderr and "nothing was enqueued" in result.stderr
    assert job_count(conn) == 1


# --- the Python API ------------------------------------------------------------------


@pytest.mark.parametrize("how_many", [3, 300])  # from arrays; through COPY from 200
def test_api_skip_gives_the_holders_id_and_error_leaves_the_callers_work_alone(
    dsn: str, conn: psycopg.Connection[Any], how_many: int
) -> None:
    with psycopg.connect(dsn) as app:
        first = pgqctl.enqueue(app, "sync", {"user": 1}, unique_key="user:1")
        app.commit()
        assert pgqctl.enqueue(app, "sync", {"user": 1}, unique_key="user:1") == first
        jobs = [{"kind": "k", "unique_key": f"u{i}"} for i in range(how_many)]
        ids = pgqctl.enqueue_many(app, [*jobs, {"kind": "k", "unique_key": "user:1"}])
        assert ids[-1] == first and ids.existing == {how_many}  # type: ignore[attr-defined]
        again = pgqctl.enqueue_many(app, jobs)
        assert again == ids[:-1] and again.existing == set(range(how_many))  # type: ignore[attr-defined]
        app.commit()

        # Under error, the caller's transaction goes on without any of the call's jobs.
        pgqctl.enqueue(app, "mine", {})
        with pytest.raises(pgqctl.DuplicateJob) as raised:
            pgqctl.enqueue_many(
                app, [{"kind": "k", "unique_key": "new"}, *jobs], on_conflict="error"
            )
        assert raised.value.holder == ids[0] and raised.value.unique_key == "u0"
        app.commit()
    kinds = conn.execute("SELECT kind, count(*) FROM jobs GROUP BY kind ORDER BY kind").fetchall()
    assert kinds == [("k", how_many), ("mine", 1), ("sync", 1)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"unique_key": ""}, "unique_key must not be empty"),
        ({"unique_key": 7}, "unique_key must be a string, not a number"),
        ({"unique_key": "k", "on_conflict": "replace"}, "on_conflict must be 'skip' or 'error'"),
    ],
)
def test_api_bad_unique_arguments_raise_before_anything_is_sent(
    conn: psycopg.Connection[Any], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(BadInput, match=message):
        pgqctl.enqueue(conn, "k", {}, **kwargs)
    assert job_count(conn) == 0


# --- plain SQL, as docs/ shows it ---------------------------------------------------


def test_plain_sql_on_conflict_do_nothing_keeps_one_job(conn: psycopg.Connection[Any]) -> None:
    for _ in range(2):
        conn.execute(
            "INSERT INTO jobs (kind, payload, unique_key)"
            " VALUES ('sync', '{\"user\": 7}', 'user:7') ON CONFLICT DO NOTHING"
        )
        conn.execute(
            "INSERT INTO jobs (kind, payload, unique_key)"
            " VALUES ('sync', '{\"user\": 7}', 'user:7')"
            " ON CONFLICT (queue, unique_key)"
            " WHERE unique_key IS NOT NULL AND status IN ('pending', 'running') DO NOTHING"
        )
    assert len(keyed(conn, "user:7")) == 1


# --- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enqueue", "k", "--unique-key", " "], "unique_key must not be empty"),
        (["enqueue", "k", "--unique-key", "a", "--on-conflict", "replace"], "--on-conflict"),
        (["enqueue", "--file", "-", "--unique-key", "a"], 'its own "unique_key"'),
        (["enqueue", "--file", "-"], "line 1: unique_key must be a string, not a number"),
    ],
)
def test_bad_unique_input_exits_2_and_enqueues_nothing(
    dsn: str, conn: psycopg.Connection[Any], args: list[str], message: str
) -> None:
    result = run_cli(*args, "--dsn", dsn, input='{"kind": "x", "unique_key": 5}\n')
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert job_count(conn) == 0


def test_api_error_mode_never_commits_for_the_caller(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(dsn) as app:  # idle, outside autocommit
        pgqctl.enqueue(app, "k", {}, unique_key="a", on_conflict="error")
        pgqctl.enqueue_many(app, [{"kind": "k", "unique_key": "b"}], on_conflict="error")
        assert job_count(conn) == 0  # still the caller's to commit
        app.rollback()
    assert job_count(conn) == 0
