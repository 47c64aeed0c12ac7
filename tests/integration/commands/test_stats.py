"""`pgqctl stats` as an operator runs it: its table and JSON, estimates on a
long history, --watch, and --metric, the figure an autoscaler reads.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import cli_json, ctrl_c_at_default, run_cli
from tests.support.jobrows import add_jobs, ago, expired, mixed_queues
from tests.support.servers import REPO_ROOT


def analyze(conn: psycopg.Connection[Any]) -> None:
    # Publish this session's row counts first, so ANALYZE's are not added to later.
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("ANALYZE jobs")


# --- estimates, honest per queue --------------------------------------------------------


def flush_statistics(conn: psycopg.Connection[Any]) -> None:
    """Publish this session's row counts now (they are sent once a second)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")


def load(dsn: str, tmp_path: Path, queue: str, n: int) -> None:
    path = tmp_path / f"{queue}.jsonl"
    path.write_text("".join(f'{{"kind": "k", "queue": "{queue}"}}\n' for _ in range(n)))
    result = run_cli("enqueue", "--file", str(path), "--dsn", dsn)
    assert result.exit_code == 0, result.stderr


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
        "limits": [],
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
        "limits": [],
    }
    table = run_cli("stats", "--format", "plain", "--dsn", dsn)
    assert table.exit_code == 0
    assert table.stdout.splitlines()[-1].split() == ["(total)", "0", "0", "0", "0", "0", "0"]


def test_stats_on_an_unmigrated_database_says_to_migrate(empty_dsn: str) -> None:
    result = run_cli("stats", "--dsn", empty_dsn)
    assert result.exit_code == 1
    assert "run `pgqctl migrate`" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


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


def test_per_queue_done_estimates_are_within_a_factor_of_2_or_not_given(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    # The statistics change only when this test analyzes: an autovacuum analyze
    # arriving between the steps would make the stale shares fresh.
    conn.execute("ALTER TABLE jobs SET (autovacuum_enabled = false)")
    load(dsn, tmp_path, "old", 30_000)
    load(dsn, tmp_path, "small", 600)
    conn.execute("ANALYZE jobs")  # as autovacuum would, while "old" is the bulk
    # The jobs run, a new queue is loaded and runs, and most of "old" is purged.
    conn.execute("UPDATE jobs SET status = 'done', attempts = 1")
    load(dsn, tmp_path, "new", 20_000)
    conn.execute("UPDATE jobs SET status = 'done', attempts = 1 WHERE status = 'pending'")
    conn.execute(
        "UPDATE jobs SET finished_at = now() - interval '8 days' "
        "WHERE id IN (SELECT id FROM jobs WHERE queue = 'old' ORDER BY id LIMIT 29000)"
    )
    assert cli_json(dsn, "purge", "--older-than", "7d") == {"deleted": 29_000}
    add_jobs(conn, 5, queue="small", status="failed", attempts=3)
    truth = {"new": 20_000, "old": 1_000, "small": 600}

    def check(*, all_told: bool) -> None:
        flush_statistics(conn)
        stats = cli_json(dsn, "stats")
        assert stats["estimated"] is True
        assert stats["totals"]["done"] == pytest.approx(21_600, rel=0.1)
        done = {q["queue"]: q["done"] for q in stats["queues"]}
        assert set(done) == set(truth)
        for queue in stats["queues"]:
            assert queue["estimated"] is True  # each marked on its own
            assert queue["failed"] == (5 if queue["queue"] == "small" else 0)  # exact
        for name, figure in done.items():
            if figure is None:
                assert not all_told, (name, done)
            else:
                assert truth[name] / 2 <= figure <= truth[name] * 2, (name, done)

    check(all_told=False)  # the shares are stale: some queues are not told
    table = run_cli("stats", "--format", "plain", "--dsn", dsn)
    assert "?" in table.stdout and "? those the statistics cannot tell" in table.stderr
    conn.execute("ANALYZE jobs")
    check(all_told=True)
    exact = cli_json(dsn, "stats", "--exact")
    assert {q["queue"]: q["done"] for q in exact["queues"]} == truth
    assert {q["estimated"] for q in exact["queues"]} == {False}


def test_stats_metric_prints_one_integer(dsn: str, conn: psycopg.Connection[Any]) -> None:
    mixed_queues(conn)
    add_jobs(conn, 2, queue="sms")

    def metric(*args: str) -> str:
        result = run_cli("stats", "--dsn", dsn, "--metric", *args)
        assert result.exit_code == 0, result.stderr
        return result.stdout

    assert metric("pending", "--queue", "emails") == "4\n"
    assert metric("pending") == "6\n"
    assert metric("pending", "--queue", "emails", "--queue", "sms") == "6\n"
    assert metric("pending", "--queue", "nothing") == "0\n"
    assert metric("expired_leases") == "2\n"
    assert metric("failed", "--queue", "sms") == "3\n"
    assert 3600 <= int(metric("oldest_pending_age_seconds", "--queue", "emails")) < 3700
    assert metric("oldest_pending_age_seconds", "--queue", "nothing") == "0\n"
    alone = run_cli("stats", "--dsn", dsn, "--queue", "emails")
    assert alone.exit_code == 2 and "--metric" in alone.stderr


def test_the_keda_scaler_query_counts_what_stats_metric_prints(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    yaml = pytest.importorskip("yaml")
    docs = [
        d for d in yaml.safe_load_all((REPO_ROOT / "deploy/kubernetes/keda.yaml").read_text()) if d
    ]
    kinds = {(d["apiVersion"], d["kind"]) for d in docs}
    assert kinds == {
        ("keda.sh/v1alpha1", "ScaledObject"),
        ("keda.sh/v1alpha1", "TriggerAuthentication"),
    }
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    worker = yaml.safe_load((REPO_ROOT / "deploy/kubernetes/worker.yaml").read_text())
    assert scaled["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    mixed_queues(conn)
    add_jobs(conn, 3, queue="default")
    (count,) = conn.execute(trigger["metadata"]["query"]).fetchone() or (None,)
    printed = run_cli("stats", "--dsn", dsn, "--metric", "pending", "--queue", "default")
    assert f"{count}\n" == printed.stdout == "3\n"


def test_stats_watch_stamps_each_snapshot(dsn: str, conn: psycopg.Connection[Any]) -> None:
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
    import datetime as dt

    stamps = [dt.datetime.fromisoformat(s["ts"]) for s in snapshots]
    assert stamps[0] < stamps[1] and stamps[1] - stamps[0] >= dt.timedelta(seconds=0.2)
    assert abs(dt.datetime.now(dt.timezone.utc) - stamps[1]) < dt.timedelta(minutes=1)
    # Without --watch the JSON shape is as it was.
    once = json.loads(run_cli("stats", "--json", "--dsn", dsn).stdout)
    assert "ts" not in once


def test_stats_ignores_a_stray_watch_variable(dsn: str) -> None:
    # A cron `stats` with PGQCTL_WATCH in its environment still ends.
    result = subprocess.run(
        [sys.executable, "-m", "pgqctl", "stats", "--json", "--dsn", dsn],
        env={**os.environ, "PGQCTL_WATCH": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1 and "ts" not in json.loads(result.stdout)
