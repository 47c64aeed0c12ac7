"""`pgqctl list` as an operator runs it: filters, order, bounds, and why a job failed."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from pgqctl import admin
from pgqctl.rows import READ_PARAMS, with_job_columns
from pgqctl.sql import query
from tests.conftest import cli_json, run_cli
from tests.support.jobrows import add_jobs, ago


def test_list_filters_newest_first_with_a_short_error(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    old, new = add_jobs(conn, 2, status="failed", attempts=3, last_error="boom\nTraceback...")
    add_jobs(conn, 1, queue="emails", status="failed", attempts=3)
    add_jobs(conn, 1, kind="other", status="failed", attempts=3)
    add_jobs(conn, 5)

    jobs = cli_json(dsn, "list", "--status", "failed", "--queue", "default", "--kind", "test")
    assert [j["id"] for j in jobs] == [new, old]
    assert jobs[0]["last_error"] == "boom\nTraceback..."

    plain = run_cli(
        "list", "--status", "failed", "--kind", "test", "--format", "plain", "--dsn", dsn
    )
    lines = plain.stdout.splitlines()
    assert lines[0].split() == [
        "id",
        "queue",
        "kind",
        "status",
        "attempt",
        "run_at",
        "finished_at",
        "error",
    ]
    assert lines[3].startswith(str(new)) and lines[3].endswith("boom")
    assert "Traceback" not in plain.stdout

    assert len(cli_json(dsn, "list")) == 9
    assert len(cli_json(dsn, "list", "--limit", "3")) == 3
    assert cli_json(dsn, "list", "--status", "running") == []


def test_a_statement_the_server_cancels_is_not_called_a_lost_connection(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(dsn) as holder:
        holder.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        pid = holder.info.backend_pid
        result = run_cli("list", "--dsn", dsn, "--lock-timeout", "200ms")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"pgqctl: error: list waited 200ms for a lock on jobs held by pid {pid} ("
    )
    assert "lost" not in result.stderr


# --- what list tells --------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "csv", "plain", "ndjson"])
def test_list_says_on_stderr_when_it_shows_fewer_than_match(
    dsn: str, conn: psycopg.Connection[Any], fmt: str
) -> None:
    add_jobs(conn, 120)
    add_jobs(conn, 7, status="failed", attempts=3)
    result = run_cli("list", "--status", "pending", "--format", fmt, "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == "pgqctl: showing 50 of 120; --limit to see more\n"
    if fmt == "json":
        assert len(json.loads(result.stdout)) == 50
    few = run_cli("list", "--status", "failed", "--format", fmt, "--dsn", dsn)
    assert few.stderr == ""
    every = run_cli("list", "--limit", "127", "--format", fmt, "--dsn", dsn)
    assert every.stderr == ""


def test_list_counts_a_long_history_only_up_to_a_bound(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 10_050, status="done", attempts=1)
    add_jobs(conn, 3)
    unbounded = run_cli("list", "--json", "--dsn", dsn)
    assert unbounded.stderr == "pgqctl: showing 50 of more than 10,000; --limit to see more\n"
    done = run_cli("list", "--status", "done", "--limit", "10", "--json", "--dsn", dsn)
    assert done.stderr == "pgqctl: showing 10 of more than 10,000; --limit to see more\n"
    live = run_cli("list", "--status", "pending", "--limit", "2", "--json", "--dsn", dsn)
    assert live.stderr == "pgqctl: showing 2 of 3; --limit to see more\n"
    # A window of creation times is counted through its block ranges, up to
    # the bound as well.
    recent = run_cli("list", "--since", "1h", "--limit", "2", "--json", "--dsn", dsn)
    assert recent.stderr == "pgqctl: showing 2 of more than 10,000; --limit to see more\n"
    # By error text with done jobs among the statuses no index bounds a
    # count: it would read the whole history, so none is taken.
    add_jobs(conn, 3, status="done", attempts=1, last_error="exit status 1")
    failing = run_cli("list", "--error", "exit", "--limit", "2", "--json", "--dsn", dsn)
    not_counted = "pgqctl: showing 2; more may match (not counted); --limit to see more\n"
    assert failing.stderr == not_counted


@pytest.mark.parametrize("fmt", ["json", "ndjson", "csv", "tsv", "plain"])
def test_list_limit_0_lists_every_match(dsn: str, conn: psycopg.Connection[Any], fmt: str) -> None:
    ids = add_jobs(conn, 2_345, status="failed", attempts=3, last_error="a\tb\nc")
    add_jobs(conn, 5)
    result = run_cli("list", "--status", "failed", "--limit", "0", "--format", fmt, "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    if fmt == "json":
        jobs = json.loads(result.stdout)
        assert [j["id"] for j in jobs] == ids[::-1]
        # The same document as a limited listing writes.
        limited = run_cli("list", "--status", "failed", "--limit", "3000", "--json", "--dsn", dsn)
        assert limited.stdout == result.stdout
    elif fmt == "ndjson":
        assert [json.loads(line)["id"] for line in lines] == ids[::-1]
    elif fmt == "tsv":
        assert len(lines) == 1 + len(ids) and "a\\tb\\nc" in lines[1]
    elif fmt == "csv":
        limited = run_cli(
            "list", "--status", "failed", "--limit", "3000", "--format", fmt, "--dsn", dsn
        )
        assert limited.stdout == result.stdout
    else:
        assert len(lines) == 2 + len(ids)


def test_list_by_id_by_age_and_in_the_order_workers_take_jobs(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (old,) = add_jobs(conn, created_at=ago("3 hours"), run_at=ago("3 hours"))
    (low,) = add_jobs(conn, priority=0, run_at=ago("1 minute"))
    (high_late,) = add_jobs(conn, priority=5, run_at=ago("-1 hour"))
    (high_early,) = add_jobs(conn, priority=5, run_at=ago("10 minutes"))
    (done,) = add_jobs(conn, status="done", attempts=1)

    def ids(*args: str) -> list[int]:
        return [j["id"] for j in cli_json(dsn, "list", *args)]

    assert ids("--id", str(low), "--id", str(done)) == [done, low]
    assert ids("--since", "1h") == [done, high_early, high_late, low]
    assert ids("--order", "next") == [high_early, high_late, old, low]
    assert ids("--order", "next", "--since", "1h", "--limit", "2") == [high_early, high_late]
    assert ids("--order", "next", "--status", "pending") == [high_early, high_late, old, low]
    refused = run_cli("list", "--order", "next", "--status", "done", "--dsn", dsn)
    assert refused.exit_code == 2
    assert "--order next lists pending jobs" in refused.stderr
    no_unit = run_cli("list", "--since", "1", "--dsn", dsn)
    assert no_unit.exit_code == 2 and "has no unit" in no_unit.stderr


def test_the_error_column_says_why_the_job_failed(dsn: str, conn: psycopg.Connection[Any]) -> None:
    script = "echo converting; echo 'convert: no such file a.png' >&2; exit 1"
    conn.execute(
        "INSERT INTO jobs (kind, payload, max_attempts) VALUES ('convert', %s, 1)",
        (json.dumps({"argv": ["sh", "-c", script]}),),
    )
    (own,) = add_jobs(conn, status="failed", attempts=3, last_error="boom\nmore about it")
    assert run_cli("worker", "--burst", "--dsn", dsn).exit_code == 0
    lines = run_cli("list", "--format", "plain", "--dsn", dsn).stdout.splitlines()
    assert lines[3].endswith("exit status 1: convert: no such file a.png"), lines[3]
    # A last_error that is not the worker's: its first line, as it was.
    assert lines[2].startswith(str(own)) and lines[2].endswith("boom")


def _blocks(node: dict[str, Any]) -> int:
    """Heap and index blocks a plan node and its children touched."""
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))


@pytest.mark.parametrize("moved", [False, True], ids=["in_jobs", "in_history"])
@pytest.mark.parametrize("kind", [None, "rare"])
def test_list_since_reads_the_window_not_the_history(
    conn: psycopg.Connection[Any], kind: str | None, moved: bool
) -> None:
    # 200,000 done jobs over the 30 days before the last hour, inserted in
    # time order as a queue that ran writes them, then a busy last hour.
    conn.execute(
        "INSERT INTO jobs (kind, payload, status, attempts, created_at, finished_at) "
        "SELECT 'test', '{}', 'done', 1, t, t FROM ("
        "  SELECT now() - interval '1 hour' - (200000 - i) * interval '13 s' AS t"
        "  FROM generate_series(1, 200000) AS i) AS spread"
    )
    if moved:
        # Where the workers move them: the history's days.
        conn.execute(
            "SELECT pgqctl_history_add_days((now() AT TIME ZONE 'UTC')::date - 31,"
            " (now() AT TIME ZONE 'UTC')::date)"
        )
        conn.execute(
            "WITH m AS (DELETE FROM jobs RETURNING *) INSERT INTO jobs_history SELECT * FROM m"
        )
    add_jobs(conn, 300, status="done", attempts=1, created_at=ago("10 minutes"))
    conn.execute("VACUUM ANALYZE jobs")
    conn.execute("VACUUM ANALYZE jobs_history")
    table_blocks = conn.execute(
        "SELECT (pg_relation_size('jobs') + (SELECT sum(pg_relation_size(relid))"
        " FROM pg_partition_tree('jobs_history'))) / 8192"
    ).fetchone()[0]
    found = admin.JobFilter((), (), (kind,) if kind else (), (), 3600.0, None)
    text = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + with_job_columns(query("job_list"))
    (since_at,) = conn.execute("SELECT now() - interval '1 hour'").fetchone()
    params = {
        **READ_PARAMS,
        **found.params(),
        "since_at": since_at,
        "newer_than": None,
        "limit": 51,
        "before": None,
        "floor": None,
    }
    ((plan,),) = conn.execute(text, params).fetchall()
    top = plan[0]["Plan"]
    assert top["Actual Rows"] == (0 if kind else 51)
    # The rows written in the window's block ranges, not the table's.
    assert _blocks(top) < table_blocks / 20, (table_blocks, json.dumps(plan, indent=1))
    shown = admin.count_jobs(conn, found)
    assert shown == admin.Matched(0 if kind else 300, exact=True)
