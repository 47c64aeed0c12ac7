"""The ways a bulk load reaches the table, and that each gives the same jobs.

A chunk of jobs without a unique key, due at once, goes through COPY
straight into jobs when the role may draw ids from the id sequence; other
chunks, and every chunk of a role without that privilege (the application
role of docs/operating.md), through a temporary staging table, or from
arrays for a role without the TEMP privilege either. Whichever way, the ids
come back in input order, and a bad line fails the whole load: nothing is
enqueued and no worker is woken.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgqctl
from pgqctl.errors import BadInput
from pgqctl.intake import direct_copy, loading
from tests.conftest import run_cli
from tests.support.jobrows import enqueue_file_unheard
from tests.support.servers import REPO_ROOT, Roles, clean_env, dbname_of, roles

__all__ = ["roles"]

# The roles a load may run as, by the ways open to them.
WAYS = ["direct", "staged", "arrays", "direct_without_temp"]


def producer_dsn(dsn: str, roles: Roles, way: str) -> str:
    """The test database as a role whose privileges open `way` to its loads:
    the superuser has them all; the others have the application role's
    grants, plus TEMP or USAGE on the id sequence as `way` needs."""
    database = sql.Identifier(dbname_of(dsn))
    with psycopg.connect(dsn, autocommit=True) as c:
        if way in ("arrays", "direct_without_temp"):
            c.execute(sql.SQL("REVOKE TEMP ON DATABASE {} FROM PUBLIC").format(database))
        else:
            c.execute(sql.SQL("GRANT TEMP ON DATABASE {} TO PUBLIC").format(database))
        if way == "direct":
            return dsn
        role = roles.create(way)
        name = sql.Identifier(role)
        c.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(name))
        c.execute(
            sql.SQL(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}"
            ).format(name)
        )
        if way == "direct_without_temp":
            c.execute(sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {}").format(name))
    return roles.dsn(dsn, role)


@pytest.fixture(params=WAYS)
def producer(request: pytest.FixtureRequest, dsn: str, roles: Roles) -> str:
    return producer_dsn(dsn, roles, request.param)


def mixed_lines() -> list[str]:
    """A file whose first two chunks (500 and 2,000 lines) can go straight
    into jobs, the second with limit keys, queues, priorities and text that
    COPY escapes; the rest mixes in every field that needs the staging
    table: a delay, a run_at, unique keys (one given twice), kinds."""
    plain = [{"kind": "plain", "payload": {"i": i}} for i in range(500)]
    varied = [
        {"kind": "limited", "limit_key": "customer:1", "payload": {"i": 1}},
        {"kind": "q", "queue": "images", "priority": -5, "max_attempts": 9},
        {"kind": "esc\\aped", "payload": {"s": "tab\there\nline \\N caf\u00e9 \\u0000"}},
        {"kind": "caf\u00e9", "limit_key": "tab\\N", "queue": "\u00fc"},
        {"kind": "plain", "payload": {"argv": ["echo", "hi"]}},
    ]
    timed = [
        {"kind": "later", "delay": "5m"},
        {"kind": "dated", "run_at": "2030-01-02T03:04:05Z", "limit_key": "c:2"},
        {"kinds": ["fan_a", "fan_b"], "payload": {"order": 7}, "limit_key": "t:2"},
    ]
    keyed = [
        {"kind": "keyed", "unique_key": "k1"},
        {"kind": "keyed", "unique_key": "k1", "payload": {"second": True}},
        {"kinds": ["fan_c", "fan_d"], "unique_key": "e"},
    ]
    records = plain + varied * 400 + timed * 100 + plain + keyed + plain
    return [json.dumps(r) for r in records]


# Every column but the id, with run_at as what it says of the job.
STORED = """
SELECT kind, payload, queue, status, priority, attempts, max_attempts,
       CASE WHEN run_at > '2029-01-01' THEN run_at END AS run_at,
       CASE WHEN run_at < '2029-01-01' THEN run_at - created_at END AS delay,
       locked_until, locked_by, last_error, finished_at, handbacks, unique_key,
       schedule, tick, claimed_at, limit_key, seated
FROM jobs ORDER BY id
"""


def test_every_way_stores_the_same_jobs_and_prints_their_ids_in_order(
    dsn: str, roles: Roles, tmp_path: Path
) -> None:
    lines = mixed_lines()
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    seen = {}
    for way in WAYS:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("TRUNCATE jobs")
        result = run_cli(
            "enqueue", "--file", str(path), "--json", "--dsn", producer_dsn(dsn, roles, way)
        )
        assert result.exit_code == 0, result.stderr
        printed = json.loads(result.stdout)
        with psycopg.connect(dsn, autocommit=True) as c:
            seen[way] = c.execute(STORED).fetchall()
            ids = [row[0] for row in c.execute("SELECT id FROM jobs ORDER BY id").fetchall()]
        # One printed id per job; a repeated key prints its holder's, the rest are new, in order.
        assert [p["id"] for p in printed if not p.get("existing")] == ids, way
        assert sum(1 for p in printed if p.get("existing")) == 1, way
    # 101 lines of two kinds each; one key given twice.
    assert len(seen["direct"]) == len(lines) + 101 - 1
    assert seen["direct"][0][:4] == ("plain", {"i": 0}, "default", "pending")
    for way in WAYS:
        assert seen[way] == seen["direct"], way


@pytest.mark.parametrize("way", WAYS)
def test_a_load_of_plain_jobs_uses_the_staging_table_only_without_the_sequence_privilege(
    dsn: str, roles: Roles, way: str
) -> None:
    with psycopg.connect(producer_dsn(dsn, roles, way)) as app:
        ids = pgqctl.enqueue_many(app, [{"kind": "k", "payload": {"i": i}} for i in range(500)])
        staging = app.execute("SELECT to_regclass('pg_temp.pgqctl_enqueue_load')").fetchone()
        app.commit()
    assert (staging != (None,)) == (way == "staged")
    with psycopg.connect(dsn, autocommit=True) as c:
        table = c.execute("SELECT id, (payload->>'i')::int FROM jobs ORDER BY id").fetchall()
    assert table == [(job_id, i) for i, job_id in enumerate(ids)]


def test_ids_drawn_that_are_not_a_run_are_each_given_to_their_job_in_order(dsn: str) -> None:
    # A sequence that steps by 3 draws no run of ids, as when another session
    # draws some while a chunk draws its own: the chunk then gets them listed.
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("ALTER TABLE jobs ALTER COLUMN id SET INCREMENT BY 3")
    with psycopg.connect(dsn) as app:
        ids = pgqctl.enqueue_many(app, [{"kind": "k", "payload": {"i": i}} for i in range(2_500)])
        staging = app.execute("SELECT to_regclass('pg_temp.pgqctl_enqueue_load')").fetchone()
        app.commit()
    assert staging == (None,)  # straight into jobs, with the ids drawn first
    assert ids == list(range(ids[0], ids[0] + 3 * 2_500, 3))
    with psycopg.connect(dsn, autocommit=True) as c:
        table = c.execute("SELECT id, (payload->>'i')::int FROM jobs ORDER BY id").fetchall()
    assert table == [(job_id, i) for i, job_id in enumerate(ids)]


def test_a_bad_line_deep_in_a_big_file_enqueues_nothing_and_wakes_nobody(
    producer: str, dsn: str, tmp_path: Path
) -> None:
    # Some 20 chunks have gone to the server when line 25,000 is read.
    lines = [json.dumps({"kind": "k", "payload": {"i": i}}) for i in range(30_000)]
    lines[24_999] = '{"kind": "k", "priority": "high"}'
    result, heard = enqueue_file_unheard(dsn, tmp_path / "jobs.jsonl", lines, producer=producer)
    assert heard == []
    with psycopg.connect(dsn) as c:
        (count,) = c.execute("SELECT count(*) FROM jobs").fetchone() or (None,)
    assert result.exit_code == 2
    assert "line 25000: priority must be an integer" in result.stderr
    assert "nothing was enqueued" in result.stderr
    assert count == 0


def test_two_loads_at_once_each_get_their_own_ids_in_order(dsn: str, tmp_path: Path) -> None:
    paths = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(
            "".join(json.dumps({"kind": name, "payload": {"i": i}}) + "\n" for i in range(30_000))
        )
        paths.append(path)
    command = [sys.executable, "-m", "pgqctl", "enqueue", "--dsn", dsn, "--file"]
    loads = [
        subprocess.Popen(
            [*command, str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=clean_env(),
        )
        for path in paths
    ]
    printed = []
    for load in loads:
        out, err = load.communicate(timeout=120)
        assert load.returncode == 0, err
        printed.append([int(line) for line in out.split()])
    with psycopg.connect(dsn, autocommit=True) as c:
        stored: dict[str, list[Any]] = {"a": [], "b": []}
        for job_id, kind, i in c.execute(
            "SELECT id, kind, (payload->>'i')::int FROM jobs ORDER BY id"
        ).fetchall():
            stored[kind].append((job_id, i))
    for name, ids in zip("ab", printed, strict=True):
        assert stored[name] == [(job_id, i) for i, job_id in enumerate(ids)]
        assert ids == sorted(ids)  # each load's own, rising in its order


@pytest.mark.parametrize("autocommit", [True, False])
def test_a_bad_job_deep_in_a_big_list_enqueues_nothing_and_wakes_nobody(
    producer: str, dsn: str, autocommit: bool
) -> None:
    jobs: list[dict[str, Any]] = [{"kind": "k", "payload": {"i": i}} for i in range(30_000)]
    jobs[24_999] = {"kind": "k", "payload": {"i": "a\x00b"}}
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(producer, autocommit=autocommit) as app,
    ):
        listener.execute("LISTEN pgqctl_jobs")
        with pytest.raises(BadInput, match=r"^jobs\[24999\]: payload contains a NUL character"):
            pgqctl.enqueue_many(app, jobs)
        # Nothing sent in the caller's transaction; in autocommit mode, the
        # call's own transaction rolled back. Either way the connection is
        # as it was, and usable.
        assert app.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert pgqctl.enqueue_many(app, jobs[:300])
        app.commit()
        assert len(list(listener.notifies(timeout=0.5))) == 1
        (count,) = listener.execute("SELECT count(*) FROM jobs").fetchone() or (None,)
    assert count == 300


@pytest.mark.parametrize("source", ["list", "list_in_transaction", "pipe"])
def test_a_load_of_known_length_takes_ids_without_a_gap(dsn: str, source: str) -> None:
    # A list's length, and a pipe's once it is read whole, are known before
    # the first row goes: the ids drawn for the load are as many as its jobs,
    # so the next job enqueued gets the next id.
    count = 25_000  # several chunks
    jobs = [{"kind": "k", "payload": {"i": i}} for i in range(count)]
    if source == "pipe":
        lines = "".join(json.dumps(job) + "\n" for job in jobs)
        result = run_cli("enqueue", "--file", "-", "--dsn", dsn, input=lines)
        assert result.exit_code == 0, result.stderr
        ids = [int(line) for line in result.stdout.split()]
    else:
        with psycopg.connect(dsn, autocommit=source == "list") as app:
            ids = pgqctl.enqueue_many(app, jobs)
            app.commit()
    assert ids == list(range(ids[0], ids[0] + count))
    with psycopg.connect(dsn, autocommit=True) as app:
        assert pgqctl.enqueue(app, "next") == ids[-1] + 1
        table = app.execute(
            "SELECT id, (payload->>'i')::int FROM jobs WHERE kind = 'k' ORDER BY id"
        )
        assert table.fetchall() == [(job_id, i) for i, job_id in enumerate(ids)]


@pytest.mark.parametrize("way", WAYS)
def test_chunks_of_every_shape_in_one_load_each_give_their_jobs_ids_in_input_order(
    dsn: str, roles: Roles, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chunks of 100: straight into jobs, then with limit keys (the COPY
    # names another column), then plain again on the ids in hand; a delayed
    # chunk (staged: the COPY ends, the ids in hand are given up), plain
    # ones on ids drawn after its, a keyed one, and a last plain one.
    monkeypatch.setattr(loading, "FIRST_CHUNK_JOBS", 100)
    monkeypatch.setattr(loading, "CHUNK_JOBS", 100)
    shapes: list[dict[str, Any]] = (
        [{}] * 200
        + [{"limit_key": "c:1"}] * 100
        + [{}] * 100
        + [{"delay": 300}] * 100
        + [{}] * 200
        + [{"unique_key": "once"}]
        + [{}] * 199
    )
    jobs = [{"kind": "k", "payload": {"i": i}, **shape} for i, shape in enumerate(shapes)]
    with psycopg.connect(producer_dsn(dsn, roles, way), autocommit=True) as app:
        ids = pgqctl.enqueue_many(app, jobs)
    # Rising in input order, as the workers take jobs of one priority and time.
    assert ids == sorted(set(ids)) and len(ids) == len(jobs)
    with psycopg.connect(dsn, autocommit=True) as c:
        table = c.execute(
            "SELECT id, (payload->>'i')::int, limit_key, run_at > now() + interval '1 minute',"
            " unique_key FROM jobs ORDER BY id"
        ).fetchall()
    assert table == [
        (
            job_id,
            i,
            jobs[i].get("limit_key"),
            "delay" in jobs[i],
            jobs[i].get("unique_key"),
        )
        for i, job_id in enumerate(ids)
    ]


@pytest.mark.parametrize("timeout, lag", [("1s", direct_copy.SERVER_LAG), ("1m", 29.9)])
def test_a_load_longer_than_the_statement_timeout_goes_in(
    dsn: str, monkeypatch: pytest.MonkeyPatch, timeout: str, lag: float
) -> None:
    # A piped load, its length known once read, goes by one COPY, and the
    # statement_timeout (--statement-timeout) bounds each statement. With a
    # timeout this short (1s), each chunk gets a COPY of its own, and the
    # load, longer than the timeout, goes in. With a longer one, one COPY
    # takes chunks for half the timeout less an allowance for the server's
    # lag (here made to leave 0.1 s), then another takes over.
    monkeypatch.setattr(direct_copy, "SERVER_LAG", lag)
    count = 250_000
    lines = "".join(f'{{"kind": "k", "payload": {{"i": {i}}}}}\n' for i in range(count))
    began = time.monotonic()
    result = run_cli(
        "enqueue", "--file", "-", "--statement-timeout", timeout, "--json", "--dsn", dsn,
        input=lines,
    )  # fmt: skip
    took = time.monotonic() - began
    assert result.exit_code == 0, result.stderr
    ids = [entry["id"] for entry in json.loads(result.stdout)]
    assert ids == list(range(ids[0], ids[0] + count))
    with psycopg.connect(dsn, autocommit=True) as c:
        (stored,) = c.execute("SELECT count(*) FROM jobs").fetchone() or (None,)
    assert stored == count
    if timeout == "1s":
        assert took > 1  # longer than the timeout, or the test shows nothing


@pytest.mark.parametrize("draw", [direct_copy.MAX_DRAW, 5_000])
def test_a_load_the_server_refuses_part_way_enqueues_nothing(
    dsn: str, draw: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A job put in by hand under an id the sequence will give: the COPY that
    # reaches it fails on the server, chunks after the first, and the load
    # with it, whole; the connection is left usable. The server says so
    # when the COPY ends: at the end of the load, or, with ids drawn 5,000
    # at a time, before the next draw, while rows are still being checked.
    monkeypatch.setattr(direct_copy, "MAX_DRAW", draw)
    with psycopg.connect(dsn, autocommit=True) as c:
        (last,) = c.execute("SELECT nextval(pg_get_serial_sequence('jobs', 'id'))").fetchone()
        c.execute(
            "INSERT INTO jobs (id, kind, payload) OVERRIDING SYSTEM VALUE"
            " VALUES (%s, 'by_hand', '{}')",
            [last + 12_000],
        )
    jobs = [{"kind": "k", "payload": {"i": i}} for i in range(30_000)]
    with psycopg.connect(dsn, autocommit=True) as app:
        with pytest.raises(psycopg.errors.UniqueViolation):
            pgqctl.enqueue_many(app, jobs)
        assert app.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        (kinds,) = app.execute("SELECT array_agg(kind) FROM jobs").fetchone() or (None,)
        assert kinds == ["by_hand"]
        assert len(pgqctl.enqueue_many(app, jobs[:300])) == 300
