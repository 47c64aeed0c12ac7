"""stats, leases, list, show, reap, requeue and purge as an operator runs them."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from typing import Any

import psycopg
import pytest

from tests.conftest import ctrl_c_at_default, run_cli
from tests.integration.jobrows import add_jobs, ago, expired, snapshot


def cli_json(dsn: str, *args: str) -> Any:
    result = run_cli(*args, "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


# --- stats -----------------------------------------------------------------------


def test_stats_json_has_the_documented_shape(dsn: str, conn: psycopg.Connection[Any]) -> None:
    add_jobs(conn, 2, run_at=ago("1 minute"))
    add_jobs(conn, 1, queue="emails", run_at=ago("1 hour"))
    add_jobs(conn, 1, queue="emails", run_at=ago("-1 hour"))  # not due yet
    expired(conn, 1, queue="emails")
    add_jobs(conn, 1, status="running", attempts=1, locked_until=ago("-5 minutes"))
    add_jobs(conn, 3, status="done", attempts=1)
    add_jobs(conn, 1, queue="emails", status="failed", attempts=3)
    add_jobs(conn, 1, queue="emails", status="cancelled", attempts=1)

    stats = cli_json(dsn, "stats")

    assert 3590 < stats.pop("oldest_pending_age_seconds") < 3700
    queues = stats.pop("queues")
    assert stats == {
        "totals": {"pending": 4, "running": 2, "done": 3, "failed": 1, "cancelled": 1},
        "expired_leases": 1,
        "estimated": False,
        "paused": [],
    }
    ages = [q.pop("oldest_pending_age_seconds") for q in queues]
    assert 55 < ages[0] < 120 and 3590 < ages[1] < 3700
    assert queues == [
        {
            "queue": "default",
            "pending": 2,
            "running": 1,
            "done": 3,
            "failed": 0,
            "cancelled": 0,
            "expired_leases": 0,
            "estimated": False,
            "paused": None,
        },
        {
            "queue": "emails",
            "pending": 2,
            "running": 1,
            "done": 0,
            "failed": 1,
            "cancelled": 1,
            "expired_leases": 1,
            "estimated": False,
            "paused": None,
        },
    ]


def test_stats_of_an_empty_queue(dsn: str) -> None:
    assert cli_json(dsn, "stats") == {
        "totals": {"pending": 0, "running": 0, "done": 0, "failed": 0, "cancelled": 0},
        "expired_leases": 0,
        "oldest_pending_age_seconds": None,
        "estimated": False,
        "queues": [],
        "paused": [],
    }
    table = run_cli("stats", "--format", "plain", "--dsn", dsn)
    assert table.exit_code == 0
    assert table.stdout.splitlines()[-1].split() == ["(total)", "0", "0", "0", "0", "0", "0"]


def test_stats_on_an_unmigrated_database_says_to_migrate(empty_dsn: str) -> None:
    result = run_cli("stats", "--dsn", empty_dsn)
    assert result.exit_code == 1
    assert "run `pgqctl migrate`" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def analyze(conn: psycopg.Connection[Any]) -> None:
    # Publish this session's row counts first, so ANALYZE's are not added to later.
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("ANALYZE jobs")


def test_stats_estimates_done_on_a_long_history_and_exact_counts_it(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 1200, status="done", attempts=1)
    add_jobs(conn, 600, queue="emails", status="done", attempts=1)
    add_jobs(conn, 50, queue="emails")
    add_jobs(conn, 10, status="failed", attempts=3)
    analyze(conn)

    estimate = cli_json(dsn, "stats")
    assert estimate["estimated"] is True
    done = {q["queue"]: q["done"] for q in estimate["queues"]}
    assert done["default"] == pytest.approx(1200, rel=0.05)
    assert done["emails"] == pytest.approx(600, rel=0.05)
    # Everything but done stays exact.
    assert {k: v for k, v in estimate["totals"].items() if k != "done"} == {
        "pending": 50,
        "running": 0,
        "failed": 10,
        "cancelled": 0,
    }

    exact = cli_json(dsn, "stats", "--exact")
    assert exact["estimated"] is False
    assert exact["totals"] == {
        "pending": 50,
        "running": 0,
        "done": 1800,
        "failed": 10,
        "cancelled": 0,
    }
    assert [q["done"] for q in exact["queues"]] == [1200, 600]

    table = run_cli("stats", "--format", "plain", "--dsn", dsn)
    assert "~" in table.stdout.splitlines()[-1]
    assert "--exact" in table.stderr


def test_stats_watch_refreshes_until_ctrl_c(dsn: str, conn: psycopg.Connection[Any]) -> None:
    add_jobs(conn, 3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgqctl", "stats", "--watch", "0.2", "--json", "--dsn", dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_at_default,
    )
    assert proc.stdout is not None
    snapshots = []
    deadline = time.monotonic() + 60
    while len(snapshots) < 2 and time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 1)[0]:
            snapshots.append(json.loads(proc.stdout.readline()))
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    assert [s["totals"]["pending"] for s in snapshots] == [3, 3]


def test_stats_watch_redraws_in_place_on_a_terminal(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 3)
    terminal, side = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgqctl", "stats", "--watch", "0.2", "--dsn", dsn],
        stdin=side,
        stdout=side,
        stderr=side,
        env={**os.environ, "COLUMNS": "100"},
        preexec_fn=ctrl_c_at_default,
    )
    os.close(side)
    screen = b""
    deadline = time.monotonic() + 60
    # Two redraws: the table drawn, moved up over, and drawn again.
    while screen.count(b"(total)") < 3 and time.monotonic() < deadline:
        if select.select([terminal], [], [], 1)[0]:
            screen += os.read(terminal, 65536)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    os.close(terminal)
    assert screen.count(b"(total)") >= 3
    assert b"\x1b[1A" in screen  # cursor up: redrawn in place, not appended


# --- leases, list, show -------------------------------------------------------------


def test_leases_human_table_shows_holder_and_time_left(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (late,) = expired(conn, kind="resize", locked_by="web-1:42:0")
    (fine,) = add_jobs(
        conn, status="running", attempts=2, locked_until=ago("-10 minutes"), locked_by="web-2:7:1"
    )
    result = run_cli("leases", "--format", "plain", "--dsn", dsn)
    assert result.exit_code == 0
    header, _, first, second = result.stdout.splitlines()
    assert header.split() == ["id", "queue", "kind", "attempt", "locked_by", "locked_until", "left"]
    assert first.split()[:5] == [str(late), "default", "resize", "1/3", "web-1:42:0"]
    assert first.split()[-1].startswith("-5m")
    assert second.split()[0] == str(fine) and second.split()[-1].startswith("9m")

    only = run_cli("leases", "--expired", "--format", "plain", "--dsn", dsn)
    assert len(only.stdout.splitlines()) == 3

    conn.execute("DELETE FROM jobs")
    none = run_cli("leases", "--expired", "--dsn", dsn)
    assert none.exit_code == 0 and none.stdout == ""
    assert "no expired leases" in none.stderr


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


def test_show_prints_every_column_with_the_payload_pretty(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    payload = json.dumps({"argv": ["convert", "a.png", "b.png"], "env": {"Q": "1"}})
    error = "exit status 1\nconvert: no such file a.png"
    (job_id,) = add_jobs(conn, payload=payload, status="failed", attempts=3, last_error=error)

    whole = cli_json(dsn, "show", str(job_id))
    columns = [r[0] for r in conn.execute("SELECT * FROM jobs LIMIT 0").description or []]
    # Every column, then what says whether payload and last_error are whole, then
    # its attempts.
    assert list(whole) == [*columns, "payload_note", "payload_cut", "last_error_cut", "history"]
    assert (whole["payload_note"], whole["payload_cut"], whole["last_error_cut"]) == (
        None,
        False,
        False,
    )
    assert whole["payload"] == json.loads(payload)
    assert whole["last_error"] == error

    table = run_cli("show", str(job_id), "--format", "plain", "--dsn", dsn)
    assert table.exit_code == 0
    assert '    "convert",' in table.stdout  # indented: pretty-printed
    assert "convert: no such file a.png" in table.stdout  # the whole error
    fields = [line.split()[0] for line in table.stdout.splitlines()[2:] if line[:1].strip()]
    assert fields == columns


# --- reap ---------------------------------------------------------------------------


def test_reap_dry_run_shows_the_outcome_and_changes_nothing(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    retry, dead = expired(conn, 2, attempts=sql_case_attempts())
    before = snapshot(conn)
    preview = cli_json(dsn, "reap", "--dry-run")
    assert [(j["id"], j["status"], j["held_by"]) for j in preview] == [
        (retry, "pending", "host:1:0"),
        (dead, "failed", "host:1:0"),
    ]
    assert snapshot(conn) == before

    plain = run_cli("reap", "--dry-run", "--format", "plain", "--dsn", dsn)
    assert "would reap 2 expired leases: 1 back to pending, 1 failed" in plain.stderr


def sql_case_attempts() -> Any:
    from psycopg import sql

    # First job attempt 1 of 3, second attempt 3 of 3.
    return sql.SQL("CASE WHEN generate_series = 1 THEN 1 ELSE 3 END")


def test_reap_says_what_it_did_and_records_the_holder(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (job_id,) = expired(conn, locked_by="web-1:42:3")
    result = run_cli("reap", "--format", "plain", "--dsn", dsn)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[2].split()[:5] == [
        str(job_id),
        "default",
        "test",
        "pending",
        "1/3",
    ]
    assert "reaped 1 expired lease: 1 back to pending, 0 failed" in result.stderr
    row = conn.execute(
        "SELECT last_error, locked_by, locked_until FROM jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None and "(held by web-1:42:3)" in row[0]
    # The lease is gone; who last held it stays on the job.
    assert row[1:] == ("web-1:42:3", None)


def test_a_running_job_without_a_lease_counts_as_expired_and_is_reaped(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    # Only plain SQL makes one; nothing but reap could ever free it.
    (bare,) = add_jobs(conn, status="running", attempts=1, locked_by="web-1:42:0")
    (held,) = add_jobs(conn, status="running", attempts=1, locked_until=ago("-10 minutes"))
    assert cli_json(dsn, "stats")["expired_leases"] == 1
    assert [(j["id"], j["expired"]) for j in cli_json(dsn, "leases")] == [
        (bare, True),
        (held, False),
    ]
    assert [j["id"] for j in cli_json(dsn, "leases", "--expired")] == [bare]
    table = run_cli("leases", "--format", "plain", "--dsn", dsn).stdout.splitlines()
    assert table[2].split()[0] == str(bare) and table[2].endswith("no lease")
    assert [j["id"] for j in cli_json(dsn, "reap", "--dry-run")] == [bare]
    assert [j["id"] for j in cli_json(dsn, "reap")] == [bare]
    row = conn.execute("SELECT status, last_error FROM jobs WHERE id = %s", (bare,)).fetchone()
    assert row == ("pending", "running without a lease (held by web-1:42:0)")
    assert conn.execute("SELECT status FROM jobs WHERE id = %s", (held,)).fetchone() == ("running",)


def test_reap_with_nothing_expired_exits_0(dsn: str, conn: psycopg.Connection[Any]) -> None:
    add_jobs(conn, status="running", attempts=1, locked_until=ago("-5 minutes"))
    result = run_cli("reap", "--dsn", dsn)
    assert (result.exit_code, result.stdout) == (0, "")
    assert result.stderr == "pgqctl: no expired leases\n"
    assert cli_json(dsn, "reap") == []

    quiet = run_cli("reap", "--quiet", "--json", "--dsn", dsn)
    assert (quiet.exit_code, quiet.stdout, quiet.stderr) == (0, "", "")

    expired(conn)
    changed = run_cli("reap", "--quiet", "--json", "--dsn", dsn)
    assert changed.exit_code == 0 and changed.stderr == ""
    assert len(json.loads(changed.stdout)) == 1


def test_reap_and_requeue_wake_listening_workers(dsn: str, conn: psycopg.Connection[Any]) -> None:
    expired(conn)
    add_jobs(conn, status="failed", attempts=3)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgqctl_jobs")
        assert run_cli("reap", "--dsn", dsn).exit_code == 0
        assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == ["public"]
        assert run_cli("requeue", "--failed", "--dsn", dsn).exit_code == 0
        assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == ["public"]


# --- requeue ------------------------------------------------------------------------


def test_requeue_narrows_by_kind_queue_and_since(dsn: str, conn: psycopg.Connection[Any]) -> None:
    recent = add_jobs(conn, 2, kind="mail", status="failed", attempts=3)
    (old,) = add_jobs(conn, kind="mail", status="failed", attempts=3, finished_at=ago("2 days"))
    (other_queue,) = add_jobs(conn, kind="mail", queue="bulk", status="failed", attempts=3)
    (other_kind,) = add_jobs(conn, kind="sms", status="failed", attempts=3)

    moved = cli_json(dsn, "requeue", "--kind", "mail", "--queue", "default", "--since", "1h")
    assert [j["id"] for j in moved] == recent
    assert {(j["status"], j["attempts"], j["max_attempts"]) for j in moved} == {("pending", 3, 4)}
    rows = conn.execute(
        "SELECT id, status, finished_at IS NULL, run_at <= now() FROM jobs ORDER BY id"
    ).fetchall()
    assert rows == [
        (recent[0], "pending", True, True),
        (recent[1], "pending", True, True),
        (old, "failed", False, True),
        (other_queue, "failed", False, True),
        (other_kind, "failed", False, True),
    ]

    again = cli_json(dsn, "requeue", "--failed", "--attempts", "3")
    assert [(j["id"], j["max_attempts"]) for j in again] == [
        (old, 6),
        (other_queue, 6),
        (other_kind, 6),
    ]


def test_requeue_keeps_attempts_and_the_last_error(dsn: str, conn: psycopg.Connection[Any]) -> None:
    (job_id,) = add_jobs(
        conn, status="failed", attempts=5, max_attempts=5, last_error="boom", locked_by="w:1:0"
    )
    (moved,) = cli_json(dsn, "requeue", "--id", str(job_id), "--attempts", "2")
    assert (moved["attempts"], moved["max_attempts"], moved["last_error"]) == (5, 7, "boom")
    assert moved["locked_by"] == "w:1:0"  # who ran it last, until another worker claims it


def test_requeue_id_of_a_job_it_does_not_take_says_which_it_takes(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (failed,) = add_jobs(conn, status="failed", attempts=3)
    (running,) = expired(conn)
    (done,) = add_jobs(conn, status="done", attempts=1)
    (pending,) = add_jobs(conn)
    result = run_cli(
        "requeue", "--id", str(failed), "--id", str(running), "--id", str(done), "--json",
        "--dsn", dsn,
    )  # fmt: skip
    assert result.exit_code == 0
    assert [j["id"] for j in json.loads(result.stdout)] == [failed]
    for job_id, status in [(running, "running"), (done, "done")]:
        takes = "requeue takes pending, failed and cancelled jobs"
        assert f"job {job_id} is {status}: {takes}; left as it is" in result.stderr
    # A status given narrows what an --id may be.
    only_failed = run_cli("requeue", "--failed", "--id", str(pending), "--dsn", dsn)
    assert only_failed.exit_code == 0
    assert f"job {pending} is pending, not failed: left as it is" in only_failed.stderr

    missing = run_cli("requeue", "--id", "999999", "--dsn", dsn)
    assert missing.exit_code == 1
    assert "job 999999 not found" in missing.stderr


def test_requeue_dry_run_shows_what_would_move_and_changes_nothing(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 3, status="failed", attempts=3)
    before = snapshot(conn)
    preview = cli_json(dsn, "requeue", "--failed", "--dry-run")
    assert [(j["status"], j["max_attempts"]) for j in preview] == [("pending", 4)] * 3
    assert snapshot(conn) == before


# --- purge --------------------------------------------------------------------------


def test_purge_deletes_old_done_rows_in_batches_and_nothing_else(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 25, status="done", attempts=1, finished_at=ago("8 days"))
    recent = add_jobs(conn, 2, status="done", attempts=1)
    failed = add_jobs(conn, 3, status="failed", attempts=3, finished_at=ago("8 days"))
    live = add_jobs(conn, 4) + expired(conn, 2)

    dry = cli_json(dsn, "purge", "--older-than", "7d", "--dry-run")
    assert dry == {"deleted": 0, "dry_run": True, "matched": 25}

    result = run_cli("purge", "--older-than", "7d", "--batch-size", "7", "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"deleted": 25}
    assert "deleted 25 done jobs finished more than 7d00h ago" in result.stderr
    remaining = [r[0] for r in conn.execute("SELECT id FROM jobs ORDER BY id")]
    assert remaining == sorted(recent + failed + live)

    assert cli_json(dsn, "purge", "--status", "failed") == {"deleted": 3}
    assert cli_json(dsn, "purge", "--status", "all") == {"deleted": 2}
    remaining = [r[0] for r in conn.execute("SELECT id FROM jobs ORDER BY id")]
    assert remaining == sorted(live)


# --- every command ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["requeue"], 2, "nothing selected"),
        (["requeue", "--failed", "--attempts", "0"], 2, "--attempts"),
        (["requeue", "--failed", "--since", "yesterday"], 2, "not a duration"),
        (["purge", "--older-than", "soon"], 2, "not a duration"),
        (["purge", "--status", "pending"], 2, "--status"),
        (["purge", "--batch-size", "0"], 2, "--batch-size"),
        (["list", "--status", "bogus"], 2, "--status"),
        (["list", "--limit", "-1"], 2, "--limit"),
        (["show", "424242"], 1, "job 424242 not found"),
        (["show", "abc"], 2, "a job id is a positive whole number, got 'abc'"),
        (["show", "99999999999999999999"], 2, "a job id is a positive whole number"),
        (["requeue", "--id", "0"], 2, "a job id is a positive whole number, got '0'"),
        (["stats", "--watch", "0"], 2, "--watch"),
    ],
)
def test_bad_input_exits_with_its_code_and_writes_nothing(
    dsn: str, conn: psycopg.Connection[Any], args: list[str], code: int, message: str
) -> None:
    add_jobs(conn, 2, status="failed", attempts=3)
    add_jobs(conn, 2, status="done", attempts=1)
    before = snapshot(conn)
    result = run_cli(*args, "--dsn", dsn)
    assert result.exit_code == code
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
    assert snapshot(conn) == before


COMMANDS = ["stats", "leases", "list", "show", "reap", "requeue", "purge"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_help_has_an_example(command: str) -> None:
    result = run_cli(command, "--help")
    assert result.exit_code == 0
    example = result.stdout.split("Example:", 1)[1]
    assert f"pgqctl {command}" in example


@pytest.mark.parametrize("group", [[], ["embedded"]])
def test_a_group_alone_shows_its_help_not_an_error(group: list[str]) -> None:
    result = run_cli(*group)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Usage: pgqctl {' '.join([*group, ''])}")
    assert "pgqctl: error" not in result.stderr and "Commands:" in result.stderr


def test_commands_work_in_another_schema(empty_dsn: str) -> None:
    assert run_cli("migrate", "--schema", "Work Queue", "--dsn", empty_dsn).exit_code == 0
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute('SET search_path = "Work Queue"')
        expired(c)
        add_jobs(c, 2, status="failed", attempts=3)
    env = {"PGQCTL_SCHEMA": "Work Queue"}
    stats = run_cli("stats", "--json", "--dsn", empty_dsn, env=env)
    assert json.loads(stats.stdout)["totals"]["failed"] == 2
    reaped = run_cli("reap", "--json", "--dsn", empty_dsn, env=env)
    assert len(json.loads(reaped.stdout)) == 1
    assert json.loads(
        run_cli("purge", "--status", "failed", "--json", "--dsn", empty_dsn, env=env).stdout
    ) == {"deleted": 2}
    assert os.environ.get("PGQCTL_SCHEMA") is None


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_that_cannot_be_written_is_one_line_and_exit_1(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 3)
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "pgqctl", "list", "--dsn", dsn],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert result.stderr == "pgqctl: error: writing the output: No space left on device\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_enqueue_whose_ids_cannot_be_written_says_the_job_is_in_all_the_same(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "pgqctl", "enqueue", "ping", "--dsn", dsn],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    [(job_id,)] = conn.execute("SELECT id FROM jobs").fetchall()
    assert result.returncode == 1
    assert result.stderr == (
        f"pgqctl: error: enqueued 1 job (id {job_id}) but could not write its id: "
        "No space left on device; it is in the queue: do not enqueue it again\n"
    )


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


@pytest.mark.slow
def test_bytes_that_are_not_utf8_are_bad_input_not_a_traceback(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    def pgqctl(*args: str | bytes, **env: bytes) -> subprocess.CompletedProcess[bytes]:
        environ = {**os.environb, **{k.encode(): v for k, v in env.items()}}
        command = [sys.executable, "-m", "pgqctl", *args]
        return subprocess.run(command, env=environ, capture_output=True, timeout=30)

    listed = pgqctl("list", "--kind", b"k\xff", "--dsn", dsn)
    assert (listed.returncode, listed.stderr) == (
        2,
        b"pgqctl: error: argument 3 (after --kind) is not valid UTF-8: "
        b"give names, payloads and DSNs as UTF-8 text\n",
    )
    # Named, never shown: the value may hold a password.
    secret = b"postgresql://alice:s\xe9cret@127.0.0.1/x"
    for args in (["--dsn", secret], [b"--dsn=" + secret]):
        refused = pgqctl("stats", *args)
        assert refused.returncode == 2
        assert b"cret" not in refused.stderr and b"--dsn" in refused.stderr
    # A worker given such a queue exits at once instead of failing forever.
    worker = pgqctl("worker", "--burst", "--dsn", dsn, PGQCTL_QUEUE=b"q\xff")
    assert worker.returncode == 2
    assert worker.stderr.startswith(b"pgqctl: error: PGQCTL_QUEUE is not valid UTF-8")
    # UTF-8 text is text whatever the locale says, and a handler is any bytes.
    c_locale = {"LC_ALL": b"C", "PYTHONUTF8": b"0", "PYTHONCOERCECLOCALE": b"0"}
    added = pgqctl("enqueue", "h\u00e9llo".encode(), "--dsn", dsn, **c_locale)
    assert added.returncode == 0, added.stderr
    handler = pgqctl(
        "worker",
        "--burst",
        "--kind",
        "other",
        "--handler",
        b"other=/opt/caf\xe9/run",
        "--dsn",
        dsn,
        **c_locale,
    )
    assert handler.returncode == 0, handler.stderr
    assert conn.execute("SELECT kind, status FROM jobs").fetchall() == [("h\u00e9llo", "pending")]


@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_delimited_output_has_the_same_header_with_or_without_jobs(
    dsn: str, conn: psycopg.Connection[Any], fmt: str
) -> None:
    commands = [
        ["list"],
        ["leases"],
        ["reap", "--dry-run"],
        ["reap"],
        ["requeue", "--failed", "--dry-run"],
        ["requeue", "--failed"],
    ]

    def outputs() -> list[list[str]]:
        found = []
        for args in commands:
            result = run_cli(*args, "--format", fmt, "--dsn", dsn)
            assert result.exit_code == 0, result.stderr
            found.append(result.stdout.splitlines())
        return found

    empty = outputs()
    assert all(len(lines) == 1 for lines in empty)
    expired(conn)  # for leases and reap
    add_jobs(conn, status="failed", attempts=3)  # for requeue
    full = outputs()
    assert all(len(lines) >= 2 for lines in full)
    assert [lines[0] for lines in full] == [lines[0] for lines in empty]


@pytest.mark.parametrize(
    "args",
    [
        ["list", "--limit", "100000000000000000000"],
        ["purge", "--batch-size", "2147483648"],
        ["worker", "--max-jobs", "2147483648"],
    ],
)
def test_counts_beyond_what_the_database_takes_are_bad_input(dsn: str, args: list[str]) -> None:
    result = run_cli(*args, "--dsn", dsn)
    assert result.exit_code == 2
    # list --limit starts at 0 (every match), the others at 1.
    assert re.search(r"is not in the range [01]<=x<=2147483647", result.stderr)
