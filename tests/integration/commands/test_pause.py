"""`pgqctl pause`: the command, what the claims skip, and real worker processes
that stop and start claiming.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import time
from typing import Any

import psycopg
import pytest

from pgqctl import claims, db
from tests.conftest import cli_json, random_name, run_cli
from tests.integration.worker import test_claim_queues
from tests.integration.worker.test_claim_queues import (
    add,
    claim_params,
    exchange,
)
from tests.support.jobrows import add_jobs
from tests.support.plans import PLANS, plan_of, rows_read
from tests.support.processes import PgqctlProcess, start_worker, wait_until

__all__ = ["start_worker"]  # a fixture

# The fixtures of those modules, for these tests too.
claimer = test_claim_queues.claimer


def pauses(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    query = "SELECT queue, reason, until IS NULL FROM paused_queues ORDER BY 1"
    return conn.execute(query).fetchall()


# -- what the claims skip -----------------------------------------------------------


def pause_now(conn: psycopg.Connection[Any], queue: str, until: str | None = None) -> None:
    conn.execute(
        "INSERT INTO paused_queues (queue, until) VALUES (%s, now() + %s::interval)",
        (queue, until),
    )


# -- real workers -------------------------------------------------------------------

STARTED = re.compile(r"^(\S+) job (\d+) started: .*\(queue (\S+), slot")


def starts(worker: PgqctlProcess, queue: str = "A") -> list[float]:
    """When the worker started each job of `queue`, as Unix times."""
    found = []
    for line in worker.log.splitlines():
        match = STARTED.match(line)
        if match and match[3] == queue:
            moment = dt.datetime.strptime(match[1], "%Y-%m-%dT%H:%M:%S.%fZ")
            found.append(moment.replace(tzinfo=dt.timezone.utc).timestamp())
    return found


def sleeps(conn: psycopg.Connection[Any], n: int, seconds: float, queue: str = "A") -> None:
    add_jobs(conn, n, queue=queue, payload=json.dumps({"argv": ["sleep", str(seconds)]}))


# -- the commands ---------------------------------------------------------------


def test_pause_prints_what_it_paused_and_a_second_pause_updates_it(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    first = run_cli(
        "pause", "--force", "emails", "sms", "--for", "30m", "--reason", "smtp down", "--dsn", dsn
    )
    assert first.exit_code == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].split() == ["queue", "until", "reason", "paused_at"]
    assert [line.split()[0] for line in lines[2:]] == ["emails", "sms"]
    assert "paused 2 queues (emails, sms) for 30m00s" in first.stderr
    [row] = conn.execute(
        "SELECT extract(epoch FROM until - paused_at) FROM paused_queues WHERE queue = 'sms'"
    ).fetchall()
    assert 1799 < row[0] < 1801

    # Again without --for: until resumed; the reason stays unless one is given.
    [again] = cli_json(dsn, "pause", "emails")
    assert again["queue"] == "emails" and again["updated"] is True
    assert again["until"] is None and again["reason"] == "smtp down"
    assert pauses(conn) == [("emails", "smtp down", True), ("sms", "smtp down", False)]
    [fresh] = cli_json(dsn, "pause", "--force", "reports", "--reason", "month end")
    assert fresh["updated"] is False and fresh["reason"] == "month end"


@pytest.mark.parametrize(
    "args",
    [
        ("pause",),
        ("resume",),
        ("pause", "emails", "--for", "5"),
        ("pause", "emails", "--for", "0s"),
        ("pause", "emails", "--for", "soon"),
        ("pause", " "),
        ("pause", "", "emails"),
        ("pause", "emails", "--reason", "a", "--reason", "b"),
        ("resume", "emails", "--for", "5m"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_pauses_nothing(
    module_dsn: str, args: tuple[str, ...]
) -> None:
    result = run_cli(*args, "--dsn", module_dsn)
    assert result.exit_code == 2, result.stderr
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    with psycopg.connect(module_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM paused_queues").fetchone() == (0,)


@pytest.mark.parametrize(
    ("queue", "message"),
    [
        (random_name(3000), "queue is 3,000 characters long: the limit is 128 characters"),
        ("evil\nCRITICAL fake", r"queue holds the control character \x0a at character 5"),
        ("q\x85", r"queue holds the control character \x85 at character 2"),
    ],
)
def test_a_queue_name_no_job_can_have_is_refused_naming_the_limit(
    module_dsn: str, queue: str, message: str
) -> None:
    result = run_cli("pause", "emails", queue, "--dsn", module_dsn)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"pgqctl: error: {message}")
    assert len(result.stderr.splitlines()) == 1
    with psycopg.connect(module_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM paused_queues").fetchone() == (0,)


def test_stats_shows_paused_queues_even_with_no_jobs(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 2, queue="emails")
    add_jobs(conn, 1, queue="sms")
    assert (
        run_cli("pause", "--force", "emails", "--reason", "smtp down", "--dsn", dsn).exit_code == 0
    )
    assert run_cli("pause", "--force", "reports", "--for", "1h", "--dsn", dsn).exit_code == 0

    stats = cli_json(dsn, "stats")
    by_queue = {q["queue"]: q for q in stats["queues"]}
    assert list(by_queue) == ["emails", "reports", "sms"]
    assert by_queue["emails"]["pending"] == 2
    assert by_queue["emails"]["paused"]["reason"] == "smtp down"
    assert by_queue["emails"]["paused"]["until"] is None
    until = dt.datetime.fromisoformat(by_queue["reports"]["paused"]["until"])
    assert 3590 < (until - dt.datetime.now(dt.timezone.utc)).total_seconds() < 3610
    assert by_queue["reports"]["pending"] == 0  # paused before it has any job
    assert by_queue["sms"]["paused"] is None
    assert [p["queue"] for p in stats["paused"]] == ["emails", "reports"]

    table = run_cli("stats", "--format", "plain", "--dsn", dsn)
    rows = {line.split()[0]: line for line in table.stdout.splitlines()[2:]}
    assert table.stdout.splitlines()[0].split()[-1] == "paused"
    assert rows["emails"].endswith("until resumed: smtp down")
    assert re.search(r"until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", rows["reports"])
    assert "until" not in rows["sms"] and "until" not in rows["(total)"]


def test_every_kind_of_claim_skips_paused_queues_only_while_paused(
    conn: psycopg.Connection[Any], claimer: Any
) -> None:
    a = add(conn, [("a", "x", 0, 10)] * 3)
    b = add(conn, [("b", "x", 5, 10)] * 3)
    pause_now(conn, "b")
    pause_now(conn, "gone", "-1 second")  # ended: no pause

    def claimed(**filters: Any) -> list[int]:
        got = [j.id for j in exchange(claimer, claim=10, **filters).claimed]
        conn.execute(
            "UPDATE jobs SET status = 'pending', locked_until = NULL WHERE id = ANY(%s)", (got,)
        )
        return sorted(got)

    for filters in ({}, {"kinds": ["x"]}, {"queues": ["a", "b"]}, {"queues": ["b"]}):
        assert claimed(**filters) == (a if filters != {"queues": ["b"]} else []), filters
    conn.execute("UPDATE paused_queues SET until = now() - interval '1 second'")
    for filters in ({}, {"kinds": ["x"]}, {"queues": ["a", "b"]}):
        assert claimed(**filters) == sorted(a + b), filters


def test_next_due_skips_paused_queues_and_counts_the_end_of_a_pause(
    conn: psycopg.Connection[Any], claimer: Any
) -> None:
    add(conn, [("a", "x", 0, -600), ("b", "x", 0, -60), ("c", "y", 0, 10)])

    def due(**filters: Any) -> float | None:
        mode = "force_generic_plan" if claimer.plan == "generic" else "force_custom_plan"
        with claimer.transaction():
            claimer.execute("SELECT set_config('plan_cache_mode', %s, true)", (mode,))
            return claims.next_due(claimer, **filters)

    pause_now(conn, "b")
    for filters in ({}, {"kinds": ["x"]}, {"queues": ["a", "b"]}):
        got = due(**filters)
        assert got is not None and 590 < got < 610, filters  # a's, not b's
    assert due(queues=["b"]) is None
    # Queue c's due job waits for the end of c's pause: the worker wakes then.
    pause_now(conn, "c", "120 seconds")
    for filters in ({}, {"kinds": ["y"]}, {"queues": ["c"]}, {"queues": ["a", "c"]}):
        got = due(**filters)
        assert got is not None and 110 < got < 130, filters
    assert (due(queues=["a"]) or 0) > 590  # not a worker of c


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("filters", [{}, {"kinds": ["x"]}], ids=["all", "kind"])
def test_the_pause_check_keeps_the_claim_on_its_index_with_one_queue(
    dsn: str, conn: psycopg.Connection[Any], plan: str, filters: dict[str, Any]
) -> None:
    # One queue: from its statistics the planner would take any test of the
    # queue to reject every row, and sort the whole backlog instead of walking.
    add(conn, [("default", "x", 0, 10)] * 3000)
    conn.execute("VACUUM ANALYZE jobs")
    with db.connect(dsn, schema="public") as c:
        statement = claims.exchange_statement(**filters)
        explained = plan_of(c, statement, claim_params(5, **filters), plan)
    assert rows_read(explained) <= 20, json.dumps(explained, indent=1)


def test_pause_stops_three_workers_within_a_second_and_resume_restarts_them(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    sleeps(conn, 600, 0.1)
    # A long poll: only the claims' check stops them, only a notification restarts them.
    workers = [start_worker(dsn, "--concurrency", "2", "--poll", "30s") for _ in range(3)]
    wait_until(lambda: all(len(starts(w)) >= 3 for w in workers), 20, "every worker to claim")

    assert run_cli("pause", "A", "--dsn", dsn).exit_code == 0
    paused = time.time()
    time.sleep(2.0)
    last = max(max(starts(w)) for w in workers)
    assert last - paused < 1.0, f"a claim {last - paused:.2f}s after the pause"
    assert conn.execute("SELECT count(*) FROM jobs WHERE status = 'running'").fetchone() == (0,)
    done = conn.execute("SELECT count(*) FROM jobs WHERE status = 'done'").fetchone()
    assert done is not None and 0 < done[0] < 600  # running jobs finished, the rest wait

    assert run_cli("resume", "A", "--dsn", dsn).exit_code == 0
    resumed = time.time()
    wait_until(
        lambda: all(any(t > resumed for t in starts(w)) for w in workers),
        10,
        "every worker to claim again",
    )
    firsts = [min(t for t in starts(w) if t > resumed) - resumed for w in workers]
    assert max(firsts) < 1.0, firsts
    for w in workers:
        w.signal(signal.SIGTERM)
    assert [w.finish() for w in workers] == [0, 0, 0]
    failed = conn.execute("SELECT count(*) FROM jobs WHERE status = 'failed'").fetchone()
    assert failed == (0,)


def test_a_pause_for_two_seconds_ends_by_itself(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    sleeps(conn, 300, 0.1)
    workers = [start_worker(dsn, "--concurrency", "2", "--poll", "30s") for _ in range(2)]
    wait_until(lambda: all(starts(w) for w in workers), 20, "every worker to claim")

    [paused] = cli_json(dsn, "pause", "A", "--for", "2s")
    returned = time.time()
    until = dt.datetime.fromisoformat(paused["until"]).timestamp()
    # Until the pause ends, nothing new starts (a claim under way may finish).
    wait_until(lambda: time.time() > until + 0.05, 5, "the end of the pause")
    during = [t for w in workers for t in starts(w) if returned + 1.0 < t < until]
    assert during == []
    # With no resume and a 30s poll, each worker wakes when the pause ends.
    wait_until(lambda: all(any(t >= until for t in starts(w)) for w in workers), 10, "claims")
    firsts = [min(t for t in starts(w) if t >= until) - until for w in workers]
    assert max(firsts) < 1.0, firsts
    # Nobody removed the pause.
    assert conn.execute("SELECT count(*) FROM paused_queues").fetchone() == (1,)
    for w in workers:
        w.signal(signal.SIGTERM)
    assert [w.finish() for w in workers] == [0, 0]


def test_a_queue_paused_before_it_has_jobs_stays_paused_across_worker_restarts(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    assert run_cli("pause", "--force", "A", "--reason", "not yet", "--dsn", dsn).exit_code == 0
    first = start_worker(dsn, "--poll", "0.2s")
    first.wait_for_log("worker ")
    for queue in ("A", "A", "B"):
        enqueued = run_cli("enqueue", "t", '{"argv": ["true"]}', "--queue", queue, "--dsn", dsn)
        assert enqueued.exit_code == 0, enqueued.stderr
    wait_until(lambda: starts(first, "B"), 10, "queue B's job to start")
    time.sleep(1.0)  # five polls
    assert starts(first) == []
    first.signal(signal.SIGTERM)
    assert first.finish() == 0

    # A worker started later obeys it too: nothing of A is due for it.
    later = start_worker(dsn, "--burst")
    assert later.finish() == 0
    assert starts(later) == []
    rows = conn.execute("SELECT queue, status FROM jobs ORDER BY id").fetchall()
    assert rows == [("A", "pending"), ("A", "pending"), ("B", "done")]

    assert run_cli("resume", "A", "--dsn", dsn).exit_code == 0
    after = start_worker(dsn, "--burst")
    assert after.finish() == 0
    assert len(starts(after)) == 2
    assert conn.execute("SELECT count(*) FROM jobs WHERE status = 'done'").fetchone() == (3,)
