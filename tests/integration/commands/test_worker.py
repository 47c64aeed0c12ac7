"""`pgqctl worker` as a command: its options, what it refuses, and the
selections it runs (--burst, --max-jobs, --queue, --kind). What a worker does
with its jobs is tests/integration/worker/.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.conftest import run_cli
from tests.support.jobrows import insert_jobs, statuses


def test_a_payload_timeout_takes_the_forms_the_cli_takes(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    payloads = [
        {"argv": ["sleep", "30"], "timeout": "1s"},
        {"argv": ["sleep", "30"], "timeout": "0.5"},
        {"argv": ["true"], "timeout": "5m"},
    ]
    ids = [
        conn.execute(
            "INSERT INTO jobs (kind, payload, max_attempts) VALUES ('t', %s, 1) RETURNING id",
            (json.dumps(p),),
        ).fetchone()[0]  # type: ignore[index]
        for p in payloads
    ]
    result = run_cli("worker", "--burst", "--concurrency", "3", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    rows = dict(
        conn.execute(
            "SELECT id, status || ': ' || coalesce(last_error, '') FROM jobs WHERE id = ANY(%s)",
            (ids,),
        ).fetchall()
    )
    assert [rows[i] for i in ids] == [
        "failed: timed out after 1s",
        "failed: timed out after 0.5s",
        "done: ",
    ]


# -- options ----------------------------------------------------------------------


def test_burst_with_an_empty_queue_exits_at_once(dsn: str) -> None:
    result = run_cli("worker", "--dsn", dsn, "--burst")
    assert result.exit_code == 0, result.stderr
    assert "stopped after 0 job(s)" in result.stderr


def test_max_jobs_stops_after_that_many(conn: psycopg.Connection[Any], dsn: str) -> None:
    insert_jobs(conn, [{"argv": ["true"]}] * 5)
    result = run_cli("worker", "--dsn", dsn, "--max-jobs", "2", "--concurrency", "1")
    assert result.exit_code == 0, result.stderr
    assert statuses(conn) == {"done": 2, "pending": 3}


def test_queue_and_kind_filters(conn: psycopg.Connection[Any], dsn: str) -> None:
    conn.execute(
        "INSERT INTO jobs (queue, kind, payload) VALUES "
        """('mail', 'send', '{"argv": ["true"]}'), ('mail', 'bounce', '{"argv": ["true"]}'),"""
        """('video', 'send', '{"argv": ["true"]}')"""
    )
    result = run_cli("worker", "--dsn", dsn, "--burst", "--queue", "mail", "--kind", "send")
    assert result.exit_code == 0, result.stderr
    rows = conn.execute("SELECT queue, kind, status FROM jobs ORDER BY id").fetchall()
    assert rows == [
        ("mail", "send", "done"),
        ("mail", "bounce", "pending"),
        ("video", "send", "pending"),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--handler", "resize"), "'resize' is not KIND=COMMAND"),
        (("--handler", "resize=convert 'x"), "cannot split the command"),
        (("--handler", "a=x", "--handler", "a=y"), "--handler given twice for kind 'a'"),
        (("--lease", "0.5s"), "--lease must be at least 1s"),
        (("--poll", "0"), "--poll must be more than 0s"),
        (("--concurrency", "0"), "--concurrency"),
        (("--lease", "soon"), "is not a duration"),
    ],
)
def test_bad_options_exit_2_with_one_line(
    dsn: str, conn: psycopg.Connection[Any], args: tuple[str, ...], message: str
) -> None:
    insert_jobs(conn, [{"argv": ["true"]}])
    result = run_cli("worker", "--dsn", dsn, "--burst", *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert statuses(conn) == {"pending": 1}


@pytest.mark.parametrize("value", ["0s", "soon", "-1s"])
def test_a_bad_reap_interval_exits_2(module_dsn: str, value: str) -> None:
    result = run_cli("worker", "--burst", "--reap-every", value, "--dsn", module_dsn)
    assert result.exit_code == 2, result.stderr
    assert "--reap-every" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
